#include "qat_train.h"

#include <fstream>

namespace qgrad_examples {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Dataset head(const Dataset& d, std::int64_t n) {
  if (n <= 0 || n >= d.size()) return d;
  const std::int64_t features = d.images.size(1);
  auto img = d.images.to_vector<float>();
  auto lab = d.labels.to_vector<std::int64_t>();
  Dataset out = d;
  out.images = Tensor::from_vector(std::vector<float>(img.begin(), img.begin() + n * features), {n, features});
  out.labels = Tensor::from_vector(std::vector<std::int64_t>(lab.begin(), lab.begin() + n), {n});
  return out;
}

// Evaluation batch: a CNN's activations at 1000 images ([1000, 32, 28, 28]
// f32, 100 MB) exceed glibc's largest mmap threshold (32 MB), so every one
// was a fresh mapping whose pages the kernel zeroes: most of a CPU run's
// evaluation time was page faults. At 250 they come back from the heap.
constexpr std::int64_t kPredictBatch = 250;

std::vector<std::int64_t> predict(Sequential& model, const Dataset& data, Device dev) {
  NoGradGuard no_grad;
  DataLoader loader(data, kPredictBatch, /*shuffle=*/false, 0, false, dev);
  std::vector<std::int64_t> out;
  Batch b;
  while (loader.next(b)) {
    auto p = argmax(model(b.images), 1).cpu().to_vector<std::int64_t>();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

double accuracy(const std::vector<std::int64_t>& pred, const Dataset& data) {
  auto lab = data.labels.to_vector<std::int64_t>();
  std::int64_t ok = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) ok += pred[i] == lab[i];
  return static_cast<double>(ok) / static_cast<double>(lab.size());
}

std::vector<std::int64_t> predict_qat(Sequential& model, const Dataset& data, Device dev, bool observers_on) {
  enable_observer(model, false);
  auto p = predict(model, data, dev);
  enable_observer(model, observers_on);
  return p;
}

nlohmann::json record_json(const EpochRecord& r) {
  return {{"epoch", r.epoch}, {"phase", r.phase}, {"loss", r.loss}, {"train_acc", r.train_acc},
          {"test_acc", r.test_acc}, {"seconds", r.seconds}};
}
EpochRecord record_from(const nlohmann::json& j) {
  return {j.at("epoch").get<int>(),       j.at("phase").get<std::string>(), j.at("loss").get<double>(),
          j.at("train_acc").get<double>(), j.at("test_acc").get<double>(),  j.at("seconds").get<double>()};
}

std::size_t bytes_of(const NamedTensors& t) {
  std::size_t n = 0;
  for (const auto& [name, x] : t) n += x.nbytes();
  return n;
}

void write_metrics(const std::string& path, const std::vector<EpochRecord>& records) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << "epoch,phase,loss,train_acc,test_acc,seconds\n";
  f.precision(9);
  for (const auto& r : records)
    f << r.epoch << ',' << r.phase << ',' << r.loss << ',' << r.train_acc << ',' << r.test_acc << ',' << r.seconds
      << '\n';
}

std::vector<std::string> write_curves(const std::vector<EpochRecord>& records, const std::string& out,
                                      PlotFormat format) {
  LineChart loss{"Training loss", "epoch (float, then QAT)", "cross-entropy", {}};
  LineChart acc{"Accuracy", "epoch (float, then QAT)", "accuracy (%)", {}};
  for (const char* phase : {"float", "qat"}) {
    Series l{std::string(phase) + " train loss", {}, {}}, tr{std::string(phase) + " train", {}, {}},
        te{std::string(phase) + " test", {}, {}};
    int x = 0;
    for (const auto& r : records) {
      ++x;
      if (r.phase != phase) continue;
      l.x.push_back(x), l.y.push_back(r.loss);
      tr.x.push_back(x), tr.y.push_back(100 * r.train_acc);
      te.x.push_back(x), te.y.push_back(100 * r.test_acc);
    }
    if (l.x.empty()) continue;
    loss.series.push_back(l);
    acc.series.push_back(tr);
    acc.series.push_back(te);
  }
  std::vector<std::string> files;
  files.push_back(plot_lines(loss, out + "/loss", format));
  files.push_back(plot_lines(acc, out + "/accuracy", format));
  return files;
}

std::string write_weight_grid(const std::vector<double>& weights, double scale, double zero_point, std::int64_t qmin,
                              std::int64_t qmax, const std::string& title, const std::string& path,
                              PlotFormat format) {
  const double s = scale, z = zero_point;
  Histogram h;
  h.title = title + " (scale " + std::to_string(s) + ")";
  h.xlabel = "weight";
  h.values = weights;
  h.bins = 120;
  for (std::int64_t q = qmin; q <= qmax; ++q)
    h.grid.push_back((static_cast<double>(q) - z) * s);
  h.grid_label = "int8 levels";
  return plot_histogram(h, path, format);
}

FlowResult run_flow(Trainer& trainer, Sequential& model, const FlowOptions& o, const Dataset& test, Device dev,
                    const std::function<void(Sequential&)>& prepare) {
  FlowResult r;
  r.recipe = o.recipe;
  const auto fake_quant = [&](bool on) {
    if (o.enable_fake_quant) o.enable_fake_quant(model, on);
    else enable_fake_quant(model, on);
  };
  r.float_bytes = bytes_of(model.named_parameters());
  // --resume into the QAT phase skips the float phase: its results (metrics,
  // float_acc, float.safetensors) were written by the interrupted run.
  const std::string resume_phase = o.resume ? trainer.open_resume() : "";
  r.float_acc = trainer.float_acc;
  if (!o.qat_from_scratch && resume_phase != "qat") {
    trainer.run(model, {"float", o.epochs, o.lr, false, true, 0}, o.out);
    // The float phase ends in eval mode on the model its last epoch evaluated.
    const bool evaluated = trainer.evaluated_last("float", test);
    r.float_acc = trainer.float_acc =
        accuracy(evaluated ? trainer.last_test_pred : predict(model, test, dev), test);
    if (trainer.writer()) save_checkpoint(o.out + "/float.safetensors", model, nullptr, {{"phase", "float"}});
  }
  prepare(model);
  if (o.qat_from_scratch)  // observe while the weights move most, freeze for the last quarter
    trainer.run(model, {"qat", o.epochs, o.lr, true, true, std::max(2, o.epochs - o.epochs / 4)}, o.out);
  else  // fine-tuning: observe during the first epoch, then freeze
    trainer.run(model, {"qat", o.qat_epochs, o.qat_lr, true, false, 2, o.freeze_bn_epoch}, o.out);
  if (!trainer.writer()) return r;  // the rest (evaluation, files) is rank 0's: r.int8 stays null
  model.eval();
  // The last QAT epoch evaluated this model as it stands (eval mode, observers off).
  const bool qat_evaluated = trainer.evaluated_last("qat", test);
  const auto qat_pred = qat_evaluated ? trainer.last_test_pred : predict_qat(model, test, dev, false);
  r.qat_acc = accuracy(qat_pred, test);
  if (o.qat_from_scratch) {
    // The same weights without fake quantization.
    fake_quant(false);
    r.float_acc = accuracy(predict(model, test, dev), test);
    fake_quant(true);
  }
  save_checkpoint(o.out + "/qat.safetensors", model, nullptr, {{"phase", "qat"}});

  r.int8 = o.convert ? o.convert(model) : convert(model);
  const auto int8_pred = predict(*r.int8, test, dev);
  r.int8_acc = accuracy(int8_pred, test);
  std::int64_t agree = 0;
  for (std::size_t i = 0; i < int8_pred.size(); ++i) agree += int8_pred[i] == qat_pred[i];
  r.agreement = static_cast<double>(agree) / static_cast<double>(int8_pred.size());
  r.int8_bytes = bytes_of(r.int8->state_dict());
  save_safetensors(o.out + "/" + o.recipe + ".safetensors", r.int8->state_dict(),
                   o.converted_metadata ? o.converted_metadata(*r.int8) : Metadata{{"format", o.int8_format}});
  return r;
}

void write_report(const std::string& path, const FlowResult& res, Device dev, std::uint64_t seed,
                  std::int64_t train_examples, std::int64_t test_examples, const std::vector<EpochRecord>& records,
                  const std::string& flags_text, Clock::time_point t_start, const nlohmann::ordered_json& extra) {
  nlohmann::ordered_json r;
  r["float_acc"] = res.float_acc;
  r["qat_acc"] = res.qat_acc;
  r[res.recipe + "_acc"] = res.int8_acc;
  r[res.recipe + "_vs_qat_agreement"] = res.agreement;
  r["model_bytes"] = {{"float", res.float_bytes}, {res.recipe, res.int8_bytes}};
  r["recipe"] = res.recipe;
  for (const auto& [k, v] : extra.items()) r[k] = v;
  r["device"] = dev.str();
  r["seed"] = seed;
  r["train_examples"] = train_examples;
  r["test_examples"] = test_examples;
  nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
  for (const auto& e : records)
    epochs.push_back({{"phase", e.phase}, {"epoch", e.epoch}, {"loss", e.loss}, {"train_acc", e.train_acc},
                      {"test_acc", e.test_acc}});
  r["epochs"] = epochs;
  r["flags"] = nlohmann::ordered_json::parse(flags_text);
  nlohmann::ordered_json timing;
  nlohmann::ordered_json per_epoch = nlohmann::ordered_json::array();
  double train_secs = 0;
  for (const auto& e : records) per_epoch.push_back(e.seconds), train_secs += e.seconds;
  timing["seconds_per_epoch"] = per_epoch;
  timing["train_samples_per_second"] =
      train_secs > 0 ? static_cast<double>(train_examples) * static_cast<double>(records.size()) / train_secs : 0;
  timing["total_seconds"] = seconds_since(t_start);
  r["timing"] = timing;  // the only part that differs between identical runs
  std::ofstream o(path);
  if (!o) throw std::runtime_error("cannot write " + path);
  o << r.dump(2) << '\n';
}

void print_summary(const FlowResult& r, bool qat_from_scratch, const std::string& report_path, const std::string& out,
                   const std::vector<std::string>& plots, const Trainer& trainer, Clock::time_point t_start,
                   const std::vector<std::string>& onnx_files) {
  std::printf("\nfloat test accuracy  %6.2f%%%s\n", 100 * r.float_acc, qat_from_scratch ? " (QAT weights, fake quant off)" : "");
  std::printf("QAT test accuracy    %6.2f%%  (fake quant)\n", 100 * r.qat_acc);
  std::printf("%-5s test accuracy  %6.2f%%  (agrees with QAT on %.2f%% of test images)\n", r.recipe.c_str(),
              100 * r.int8_acc, 100 * r.agreement);
  std::printf("model bytes          float %zu, %s %zu\n", r.float_bytes, r.recipe.c_str(), r.int8_bytes);
  std::printf("total                %.1f s\n", seconds_since(t_start));
  std::printf("report   %s\nmetrics  %s/metrics.csv\n", report_path.c_str(), out.c_str());
  for (const auto& p : plots) std::printf("plot     %s\n", p.c_str());
  std::printf("graph    %s%s%s\n", trainer.dot_path.c_str(), trainer.dot_svg.empty() ? "" : " -> ",
              trainer.dot_svg.c_str());
  for (const auto& e : onnx_files) std::printf("onnx     %s\n", e.c_str());
  std::printf("output   %s\n", (std::filesystem::absolute(out).lexically_normal() / "").string().c_str());
}

}  // namespace qgrad_examples
