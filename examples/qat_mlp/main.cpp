// qgrad-qat-mlp: quantization-aware training of a 784-256-256-10 MLP on
// Fashion-MNIST, end to end:
//   1. train the float model (SGD, Nesterov momentum 0.9, cosine schedule);
//   2. prepare_qat: fake quant on the input, every weight and every layer
//      output; fine-tune, freezing the observers after the first QAT epoch;
//   3. convert to an int8 model (s8 weights, int32 sums) and evaluate all
//      three on the test set.
// Writes <out>/metrics.csv, <out>/report.json, plots (PNG with gnuplot,
// SVG otherwise), the graph of one QAT training step (DOT, and SVG when
// Graphviz is installed) and safetensors checkpoints.
//
// report.json: everything except its "timing" object is a function of the
// flags, the data and the device, bit-identical between runs with the same
// seed on the same device; "timing" holds the wall-clock measurements.
//
//   qgrad-qat-mlp [--epochs 6] [--qat-epochs 2] [--device auto|cpu|cuda] [--out qat-mlp-out] ...
//   longer schedule: --epochs 30 --qat-epochs 3
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qgrad/nn/nn.h"
#include "plot.h"
#include "qgrad/qgrad.h"
#include "../cli_checks.h"

using namespace qgrad;
using namespace qgrad::nn;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  int epochs = 6;
  int qat_epochs = 2;
  std::int64_t batch = 128;
  double lr = 0.05;
  double qat_lr = 0.005;
  double weight_decay = 5e-4;
  double momentum = 0.9;
  bool nesterov = true;
  std::string device = "auto";
  std::uint64_t seed = 1;
  std::string data = kFashionMnistDir;
  std::string out = "qat-mlp-out";
  std::string report;
  bool qat_from_scratch = false;
  std::int64_t limit_train = 0, limit_test = 0;  // hidden, for the ctest smoke test
  std::string plot_format = "auto";              // hidden: auto, png, svg
  std::string export_onnx;                       // --export-onnx PATH
  bool onnx_no_clamp = false;                    // hidden: measure the graph without the quant-range clamp
};

struct EpochRecord {
  int epoch;
  std::string phase;
  double loss, train_acc, test_acc, seconds;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The first n examples (n <= 0: all).
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

std::shared_ptr<Sequential> make_mlp(Generator& gen, Device dev) {
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(784, 256, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(256, 256, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(256, 10, gen);
  m->to(dev);
  return m;
}

// Predicted class of every example (no graph is recorded).
std::vector<std::int64_t> predict(Sequential& model, const Dataset& data, Device dev) {
  NoGradGuard no_grad;
  DataLoader loader(data, 1000, /*shuffle=*/false, 0, false, dev);
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

// Evaluates a prepared model without letting the test set move its observers.
std::vector<std::int64_t> predict_qat(Sequential& model, const Dataset& data, Device dev, bool observers_on) {
  enable_observer(model, false);
  auto p = predict(model, data, dev);
  enable_observer(model, observers_on);
  return p;
}

// The model's output (logits, [N, classes] row-major) on every example.
std::vector<float> logits(Sequential& model, const Dataset& data, Device dev) {
  NoGradGuard no_grad;
  DataLoader loader(data, 1000, /*shuffle=*/false, 0, false, dev);
  std::vector<float> out;
  Batch b;
  while (loader.next(b)) {
    auto y = model(b.images).cpu().to_vector<float>();
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// <base>_logits.npy (f32 [N, classes]) and <base>_predictions.txt (the
// first largest logit's class, one line per example), for scripts/onnx_check.py.
void write_outputs(const std::string& base, const std::vector<float>& y, std::size_t n) {
  const std::size_t classes = n ? y.size() / n : 0;
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) + ", " +
                       std::to_string(classes) + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ').push_back('\n');
  std::ofstream npy(base + "_logits.npy", std::ios::binary);
  const auto len = static_cast<std::uint16_t>(header.size());
  npy << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(len & 0xff) << static_cast<char>(len >> 8) << header;
  npy.write(reinterpret_cast<const char*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(float)));
  std::ofstream txt(base + "_predictions.txt");
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = y.data() + i * classes;
    txt << std::max_element(row, row + classes) - row << '\n';
  }
  if (!npy || !txt) throw std::runtime_error("cannot write " + base + "_{logits.npy,predictions.txt}");
}

// --export-onnx PATH: the int8 model to PATH, the QAT model's QDQ form to
// <stem>_qat.onnx beside it, and qgrad's logits and predictions of both on
// the test set (<stem>_int8_*, <stem>_qat_*). Returns the files written.
std::vector<std::string> export_models(const std::string& path, Sequential& qat, Sequential& int8,
                                       const Dataset& test, Device dev, bool clamp) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string stem = (p.parent_path() / p.stem()).string();
  const Tensor example = zeros({1, test.images.size(1)});
  OnnxExportOptions options;
  options.clamp_to_quant_range = clamp;
  export_onnx(int8, example, path, options);
  export_onnx(qat, example, stem + "_qat.onnx", options);
  const auto n = static_cast<std::size_t>(test.size());
  write_outputs(stem + "_int8", logits(int8, test, dev), n);
  enable_observer(qat, false);
  write_outputs(stem + "_qat", logits(qat, test, dev), n);
  return {path, stem + "_qat.onnx", stem + "_int8_{logits.npy,predictions.txt}",
          stem + "_qat_{logits.npy,predictions.txt}"};
}

// The progress line: a bar on a terminal, nothing otherwise (the caller
// prints one line per epoch).
class Progress {
 public:
  Progress(std::string title, std::int64_t batches)
      : title_(std::move(title)), batches_(batches), tty_(::isatty(STDOUT_FILENO) != 0), start_(Clock::now()) {}
  void update(std::int64_t done, std::int64_t samples, double loss, double acc) const {
    if (!tty_) return;
    const int width = 30;
    const int fill = static_cast<int>(width * done / std::max<std::int64_t>(batches_, 1));
    std::printf("\r%-14s [%s%s] %3d%%  loss %.4f  acc %6.2f%%  %7.0f samples/s", title_.c_str(),
                std::string(static_cast<std::size_t>(fill), '#').c_str(),
                std::string(static_cast<std::size_t>(width - fill), '.').c_str(),
                static_cast<int>(100 * done / std::max<std::int64_t>(batches_, 1)), loss, 100 * acc,
                static_cast<double>(samples) / std::max(seconds_since(start_), 1e-9));
    std::fflush(stdout);
  }
  void finish() const {
    if (tty_) std::printf("\r\033[K");
  }

 private:
  std::string title_;
  std::int64_t batches_;
  bool tty_;
  Clock::time_point start_;
};

// Running loss and accuracy, kept on the device between progress updates so
// a step never waits for the device.
class RunningStats {
 public:
  void add(const Tensor& loss, const Tensor& logits, const Tensor& labels) {
    NoGradGuard no_grad;
    loss_sum_ = loss_sum_.defined() ? add_(loss_sum_, loss) : loss.detach().clone();
    pending_.push_back({argmax(logits.detach(), 1), labels});
    ++batches_;
  }
  void flush() {
    for (auto& [pred, lab] : pending_) {
      auto p = pred.cpu().to_vector<std::int64_t>(), l = lab.cpu().to_vector<std::int64_t>();
      for (std::size_t i = 0; i < p.size(); ++i) correct_ += p[i] == l[i];
      seen_ += static_cast<std::int64_t>(p.size());
    }
    pending_.clear();
    loss_ = loss_sum_.defined() ? loss_sum_.item() / static_cast<double>(batches_) : 0.0;
  }
  double loss() const { return loss_; }
  double accuracy() const { return seen_ ? static_cast<double>(correct_) / static_cast<double>(seen_) : 0.0; }
  std::int64_t seen() const { return seen_; }

 private:
  static Tensor add_(const Tensor& a, const Tensor& b) { return ::qgrad::add(a, b.detach()); }
  Tensor loss_sum_;
  std::vector<std::pair<Tensor, Tensor>> pending_;
  std::int64_t batches_ = 0, correct_ = 0, seen_ = 0;
  double loss_ = 0;
};

struct Phase {
  std::string name;  // "float" or "qat"
  int epochs;
  double lr;
  bool qat;
  bool warmup;        // linear warmup (training from scratch)
  int freeze_epoch;   // QAT: observers are off from this epoch on
};

class Trainer {
 public:
  Trainer(const Flags& f, Device dev, const Dataset& train, const Dataset& test)
      : f_(f), dev_(dev), train_(train), test_(test), loader_(train, f.batch, true, f.seed, false, dev) {}

  // Trains `model` for one phase; records per-epoch metrics. For a QAT
  // phase the observers freeze at ph.freeze_epoch (PyTorch's recipe:
  // fine-tuning observes during its first epoch only), and the first
  // step's graph is written as DOT.
  void run(Sequential& model, const Phase& ph, const std::string& out_dir) {
    SGD opt(model.named_parameters(), SGDOptions{ph.lr, f_.momentum, 0.0, f_.weight_decay, f_.nesterov});
    const std::int64_t steps = static_cast<std::int64_t>(ph.epochs) * loader_.num_batches();
    CosineSchedule schedule(ph.lr, steps, ph.warmup ? std::min<std::int64_t>(steps / 20, 200) : 0);
    bool observers_on = true;
    for (int e = 1; e <= ph.epochs; ++e) {
      if (ph.qat && e == ph.freeze_epoch) {
        enable_observer(model, false);
        observers_on = false;
      }
      model.train();
      const auto t0 = Clock::now();
      Progress bar(ph.name + " " + std::to_string(e) + "/" + std::to_string(ph.epochs), loader_.num_batches());
      RunningStats stats;
      Batch b;
      loader_.start_epoch();
      std::int64_t i = 0;
      while (loader_.next(b)) {
        Tensor logits = model(b.images);
        Tensor loss = cross_entropy(logits, b.labels);
        if (ph.qat && e == 1 && i == 0) write_graph(loss, out_dir);
        opt.zero_grad();
        loss.backward();
        schedule.apply(opt);
        opt.step();
        stats.add(loss, logits, b.labels);
        if (++i % 25 == 0 || i == loader_.num_batches()) {
          stats.flush();
          bar.update(i, stats.seen(), stats.loss(), stats.accuracy());
        }
      }
      stats.flush();
      bar.finish();
      const double secs = seconds_since(t0);
      model.eval();
      const double test_acc =
          accuracy(ph.qat ? predict_qat(model, test_, dev_, observers_on) : predict(model, test_, dev_), test_);
      records.push_back({e, ph.name, stats.loss(), stats.accuracy(), test_acc, secs});
      std::printf("%-5s epoch %2d/%d  loss %.4f  train acc %6.2f%%  test acc %6.2f%%  %6.1f s  %7.0f samples/s\n",
                  ph.name.c_str(), e, ph.epochs, stats.loss(), 100 * stats.accuracy(), 100 * test_acc, secs,
                  static_cast<double>(stats.seen()) / secs);
      std::fflush(stdout);
    }
    if (ph.qat) enable_observer(model, false);
  }

  std::vector<EpochRecord> records;
  std::string dot_path, dot_svg;

 private:
  void write_graph(const Tensor& loss, const std::string& out_dir) {
    dot_path = out_dir + "/qat_step.dot";
    write_dot(loss, dot_path);
    if (qat_mlp::on_path("dot") && render_dot(dot_path, out_dir + "/qat_step.svg")) dot_svg = out_dir + "/qat_step.svg";
  }

  const Flags& f_;
  Device dev_;
  const Dataset& train_;
  const Dataset& test_;
  DataLoader loader_;
};

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

std::vector<std::string> write_plots(const std::vector<EpochRecord>& records, const QATLinear& layer,
                                     const std::string& out, qat_mlp::PlotFormat format) {
  qat_mlp::LineChart loss{"Training loss", "epoch (float, then QAT)", "cross-entropy", {}};
  qat_mlp::LineChart acc{"Accuracy", "epoch (float, then QAT)", "accuracy (%)", {}};
  for (const char* phase : {"float", "qat"}) {
    qat_mlp::Series l{std::string(phase) + " train loss", {}, {}}, tr{std::string(phase) + " train", {}, {}},
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
  files.push_back(qat_mlp::plot_lines(loss, out + "/loss", format));
  files.push_back(qat_mlp::plot_lines(acc, out + "/accuracy", format));
  // Output channel 0 of the first layer against its per-channel int8 grid.
  const Tensor w = layer.weight().detach().cpu();
  const std::int64_t k = w.size(1);
  auto wv = w.to(DType::f64).to_vector<double>();
  const double s = layer.weight_fake_quant().scale().cpu().to_vector<float>()[0];
  const double z = layer.weight_fake_quant().zero_point().cpu().to_vector<std::int32_t>()[0];
  qat_mlp::Histogram h;
  h.title = "Layer 0, output channel 0: weights and their int8 grid (scale " + std::to_string(s) + ")";
  h.xlabel = "weight";
  h.values.assign(wv.begin(), wv.begin() + k);
  h.bins = 120;
  for (std::int64_t q = layer.weight_fake_quant().qmin(); q <= layer.weight_fake_quant().qmax(); ++q)
    h.grid.push_back((static_cast<double>(q) - z) * s);
  h.grid_label = "int8 levels";
  files.push_back(qat_mlp::plot_histogram(h, out + "/weights_layer0", format));
  return files;
}

int run(const Flags& f, const std::string& flags_text) {
  const Device dev = f.device == "auto" ? (cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu())
                                        : Device::parse(f.device);
  const auto format = f.plot_format == "png"   ? qat_mlp::PlotFormat::png
                      : f.plot_format == "svg" ? qat_mlp::PlotFormat::svg
                                               : qat_mlp::PlotFormat::automatic;
  std::filesystem::create_directories(f.out);
  const std::string report_path = f.report.empty() ? f.out + "/report.json" : f.report;
  const auto t_start = Clock::now();

  const Dataset train = head(load_fashion_mnist("train", f.data), f.limit_train);
  const Dataset test = head(load_fashion_mnist("test", f.data), f.limit_test);
  std::printf("qgrad-qat-mlp: 784-256-256-10 MLP, Fashion-MNIST %lld train / %lld test, device %s, seed %llu\n",
              static_cast<long long>(train.size()), static_cast<long long>(test.size()), dev.str().c_str(),
              static_cast<unsigned long long>(f.seed));

  Generator gen(f.seed);
  auto model = make_mlp(gen, dev);
  const std::size_t float_bytes = bytes_of(model->named_parameters());
  Trainer trainer(f, dev, train, test);
  double float_acc = 0;
  if (!f.qat_from_scratch) {
    trainer.run(*model, {"float", f.epochs, f.lr, false, true, 0}, f.out);
    float_acc = accuracy(predict(*model, test, dev), test);
    save_checkpoint(f.out + "/float.safetensors", *model, nullptr, {{"phase", "float"}});
  }
  prepare_qat(*model);
  if (f.qat_from_scratch)  // observe while the weights move most, freeze for the last quarter
    trainer.run(*model, {"qat", f.epochs, f.lr, true, true, std::max(2, f.epochs - f.epochs / 4)}, f.out);
  else  // fine-tuning: observe during the first epoch, then freeze
    trainer.run(*model, {"qat", f.qat_epochs, f.qat_lr, true, false, 2}, f.out);
  model->eval();
  const auto qat_pred = predict_qat(*model, test, dev, false);
  const double qat_acc = accuracy(qat_pred, test);
  if (f.qat_from_scratch) {
    // The same weights without fake quantization.
    enable_fake_quant(*model, false);
    float_acc = accuracy(predict(*model, test, dev), test);
    enable_fake_quant(*model, true);
  }
  save_checkpoint(f.out + "/qat.safetensors", *model, nullptr, {{"phase", "qat"}});

  auto int8 = convert(*model);
  const auto int8_pred = predict(*int8, test, dev);
  const double int8_acc = accuracy(int8_pred, test);
  std::int64_t agree = 0;
  for (std::size_t i = 0; i < int8_pred.size(); ++i) agree += int8_pred[i] == qat_pred[i];
  const double agreement = static_cast<double>(agree) / static_cast<double>(int8_pred.size());
  const std::size_t int8_bytes = bytes_of(int8->state_dict());
  save_safetensors(f.out + "/int8.safetensors", int8->state_dict(), {{"format", "qgrad-int8-mlp"}});
  std::vector<std::string> exported;
  if (!f.export_onnx.empty()) exported = export_models(f.export_onnx, *model, *int8, test, dev, !f.onnx_no_clamp);

  write_metrics(f.out + "/metrics.csv", trainer.records);
  const auto* layer0 = dynamic_cast<const QATLinear*>((*model)[1].get());
  auto plots = write_plots(trainer.records, *layer0, f.out, format);

  nlohmann::ordered_json r;
  r["float_acc"] = float_acc;
  r["qat_acc"] = qat_acc;
  r["int8_acc"] = int8_acc;
  r["int8_vs_qat_agreement"] = agreement;
  r["model_bytes"] = {{"float", float_bytes}, {"int8", int8_bytes}};
  r["device"] = dev.str();
  r["seed"] = f.seed;
  r["train_examples"] = train.size();
  r["test_examples"] = test.size();
  nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
  for (const auto& e : trainer.records)
    epochs.push_back({{"phase", e.phase}, {"epoch", e.epoch}, {"loss", e.loss}, {"train_acc", e.train_acc},
                      {"test_acc", e.test_acc}});
  r["epochs"] = epochs;
  r["flags"] = nlohmann::ordered_json::parse(flags_text);
  nlohmann::ordered_json timing;
  nlohmann::ordered_json per_epoch = nlohmann::ordered_json::array();
  double train_secs = 0;
  for (const auto& e : trainer.records) per_epoch.push_back(e.seconds), train_secs += e.seconds;
  timing["seconds_per_epoch"] = per_epoch;
  timing["train_samples_per_second"] =
      train_secs > 0 ? static_cast<double>(train.size()) * static_cast<double>(trainer.records.size()) / train_secs : 0;
  timing["total_seconds"] = seconds_since(t_start);
  r["timing"] = timing;  // the only part that differs between identical runs
  {
    std::ofstream o(report_path);
    if (!o) throw std::runtime_error("cannot write " + report_path);
    o << r.dump(2) << '\n';
  }

  std::printf("\nfloat test accuracy  %6.2f%%%s\n", 100 * float_acc, f.qat_from_scratch ? " (QAT weights, fake quant off)" : "");
  std::printf("QAT test accuracy    %6.2f%%  (fake quant)\n", 100 * qat_acc);
  std::printf("int8 test accuracy   %6.2f%%  (agrees with QAT on %.2f%% of test images)\n", 100 * int8_acc,
              100 * agreement);
  std::printf("model bytes          float %zu, int8 %zu\n", float_bytes, int8_bytes);
  std::printf("total                %.1f s\n", seconds_since(t_start));
  std::printf("report   %s\nmetrics  %s/metrics.csv\n", report_path.c_str(), f.out.c_str());
  for (const auto& p : plots) std::printf("plot     %s\n", p.c_str());
  std::printf("graph    %s%s%s\n", trainer.dot_path.c_str(), trainer.dot_svg.empty() ? "" : " -> ",
              trainer.dot_svg.c_str());
  for (const auto& e : exported) std::printf("onnx     %s\n", e.c_str());
  std::printf("output   %s\n", (std::filesystem::absolute(f.out).lexically_normal() / "").string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using qgrad_examples::integer_in;
  using qgrad_examples::number_in;
  CLI::App app{"Quantization-aware training of an MLP on Fashion-MNIST with qgrad"};
  Flags f;
  app.add_option("--epochs", f.epochs, "float epochs (QAT epochs with --qat-from-scratch)")
      ->capture_default_str()
      ->check(integer_in(1, 10000));
  app.add_option("--qat-epochs", f.qat_epochs, "QAT fine-tuning epochs (observers freeze after the first)")
      ->capture_default_str()
      ->check(integer_in(1, 10000));
  app.add_option("--batch", f.batch, "mini-batch size")->capture_default_str()->check(integer_in(1, 60000));
  app.add_option("--lr", f.lr, "peak learning rate of the float phase (cosine schedule)")
      ->capture_default_str()
      ->check(number_in(0, 10, /*lo_open=*/true));
  app.add_option("--qat-lr", f.qat_lr, "peak learning rate of the QAT fine-tuning")
      ->capture_default_str()
      ->check(number_in(0, 10, /*lo_open=*/true));
  app.add_option("--weight-decay", f.weight_decay, "SGD weight decay")->capture_default_str()->check(number_in(0, 1));
  app.add_option("--device", f.device, "auto, cpu, cuda or cuda:N")->capture_default_str()->check(qgrad_examples::device_name(true));
  app.add_option("--seed", f.seed, "seed of the initialisation and the shuffling")
      ->capture_default_str()
      ->check(qgrad_examples::seed_value());
  app.add_option("--data", f.data, "folder with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--out", f.out, "output folder")->capture_default_str();
  app.add_option("--report", f.report, "path of report.json (default <out>/report.json)");
  app.add_flag("--qat-from-scratch", f.qat_from_scratch, "train with fake quant from the start (no float phase)");
  app.add_option("--export-onnx", f.export_onnx,
                 "write the int8 model as ONNX to PATH, its QAT (QDQ) form to <stem>_qat.onnx, and qgrad's test-set "
                 "logits and predictions of both beside them (check with scripts/onnx_check.py)");
  app.add_option("--limit-train", f.limit_train, "use only the first N training images (testing; 0: all)")
      ->check(integer_in(0, 60000))
      ->group("Testing options");
  app.add_option("--limit-test", f.limit_test, "use only the first N test images (testing; 0: all)")
      ->check(integer_in(0, 10000))
      ->group("Testing options");
  app.add_option("--plot-format", f.plot_format, "auto, png or svg")
      ->check(CLI::IsMember({"auto", "png", "svg"}))
      ->group("Testing options");
  app.add_flag("--onnx-no-clamp", f.onnx_no_clamp,
               "--export-onnx without the clamp to narrower quant ranges (testing; see docs/export.md)")
      ->group("Testing options");
  bool probe_cuda = false;
  app.add_flag("--probe-cuda", probe_cuda, "exit 0 when a CUDA device is present, 77 otherwise (testing)")->group("Testing options");
  CLI11_PARSE(app, argc, argv);
  if (probe_cuda) return cuda_device_count() > 0 ? 0 : 77;

  nlohmann::ordered_json flags = {{"epochs", f.epochs},
                                  {"qat_epochs", f.qat_epochs},
                                  {"batch", f.batch},
                                  {"lr", f.lr},
                                  {"qat_lr", f.qat_lr},
                                  {"weight_decay", f.weight_decay},
                                  {"momentum", f.momentum},
                                  {"nesterov", f.nesterov},
                                  {"device", f.device},
                                  {"seed", f.seed},
                                  {"qat_from_scratch", f.qat_from_scratch},
                                  {"limit_train", f.limit_train},
                                  {"limit_test", f.limit_test}};
  try {
    return run(f, flags.dump());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
