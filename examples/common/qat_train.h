// The training loop and the outputs shared by the QAT examples
// (qgrad-qat-mlp, qgrad-qat-cnn, qgrad-qat-vit): the float / QAT phases with
// SGD or AdamW and a cosine schedule, per-epoch metrics, the graph of one
// QAT step, training checkpoints for --checkpoint-every / --resume,
// evaluation, metrics.csv, report.json and the plots. Moved out of examples/qat_mlp/main.cpp when
// the CNN example came (docs/design.md, "Why examples/common").
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plot.h"
#include "qgrad/nn/nn.h"
#include "qgrad/qgrad.h"

namespace qgrad_examples {

using namespace qgrad;
using namespace qgrad::nn;
using Clock = std::chrono::steady_clock;

// What the training loop takes from an example's flags.
struct TrainOptions {
  std::string program;  // "qgrad-qat-mlp", in messages
  std::string out;      // output folder (the training state lives there)
  std::int64_t batch = 128;
  double momentum = 0.9, weight_decay = 5e-4;
  bool nesterov = true;
  std::uint64_t seed = 1;
  std::int64_t checkpoint_every = 0;  // --checkpoint-every N (training steps; 0: never)
  std::int64_t abort_at_step = 0;     // hidden: SIGKILL itself during training step N (testing)
  double clip_grad_norm = 0;          // --clip-grad-norm X (global L2 norm, fused into the step; 0: off)
  // "sgd" (momentum, nesterov, weight_decay as L2) or "adamw" (beta1 = 0.9,
  // beta2 = 0.999, eps 1e-8, decoupled weight_decay): qgrad-qat-vit's.
  std::string optimizer = "sgd";
  // Training-batch augmentation (qgrad-qat-vit's random shift and flip):
  // applied to each global batch before it is sharded across ranks; draws
  // from the generator the Trainer checkpoints, so runs and resumes repeat.
  std::function<Tensor(const Tensor&)> augment = nullptr;
};

// The training state of --checkpoint-every / --resume.
inline std::string train_state_path(const std::string& out) { return out + "/train_state.safetensors"; }

struct EpochRecord {
  int epoch;
  std::string phase;
  double loss, train_acc, test_acc, seconds;
};

double seconds_since(Clock::time_point t);

// The first n examples (n <= 0: all).
Dataset head(const Dataset& d, std::int64_t n);
// Predicted class of every example (no graph is recorded).
std::vector<std::int64_t> predict(Sequential& model, const Dataset& data, Device dev);
double accuracy(const std::vector<std::int64_t>& pred, const Dataset& data);
// Evaluates a prepared model without letting the test set move its observers.
std::vector<std::int64_t> predict_qat(Sequential& model, const Dataset& data, Device dev, bool observers_on);

std::size_t bytes_of(const NamedTensors& t);
void write_metrics(const std::string& path, const std::vector<EpochRecord>& records);
// loss.{png,svg} and accuracy.{png,svg}: the curves of both phases.
std::vector<std::string> write_curves(const std::vector<EpochRecord>& records, const std::string& out,
                                      PlotFormat format);
// A histogram of `weights` (one output channel) against its int8 grid
// (scale, zero point, [qmin, qmax]), to <path>.{png,svg}.
std::string write_weight_grid(const std::vector<double>& weights, double scale, double zero_point, std::int64_t qmin,
                              std::int64_t qmax, const std::string& title, const std::string& path,
                              PlotFormat format);

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
  // For the training checkpoint: flushes, then the running sums (the loss
  // sum as its tensor, so the resumed sum continues bit for bit).
  nlohmann::json save(NamedTensors& tensors) {
    flush();
    if (loss_sum_.defined()) tensors.emplace_back("stats.loss_sum", loss_sum_);
    return {{"batches", batches_}, {"correct", correct_}, {"seen", seen_}};
  }
  void load(const nlohmann::json& j, const NamedTensors& tensors, Device dev) {
    for (const auto& [n, t] : tensors)
      if (n == "stats.loss_sum") loss_sum_ = t.to(dev);
    batches_ = j.at("batches").get<std::int64_t>();
    correct_ = j.at("correct").get<std::int64_t>();
    seen_ = j.at("seen").get<std::int64_t>();
    flush();
  }
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
  int freeze_bn_epoch = 0;  // QAT: batch norm statistics frozen from this epoch on (0: never)
};

nlohmann::json record_json(const EpochRecord& r);
EpochRecord record_from(const nlohmann::json& j);

class Trainer {
 public:
  // With a process group (qgrad-run, WORLD_SIZE > 1) every rank loads the
  // same global batches of f.batch x world examples and trains on its share
  // through DistributedDataParallel; rank 0 alone writes files.
  Trainer(const TrainOptions& f, Device dev, const Dataset& train, const Dataset& test, Generator& init_gen,
          nlohmann::json flags, std::shared_ptr<qgrad::dist::ProcessGroup> pg = nullptr)
      : f_(f), dev_(dev), train_(train), test_(test), init_gen_(init_gen), flags_(std::move(flags)),
        loader_(train, f.batch * (pg ? pg->world_size() : 1), true, f.seed, false, dev), pg_(std::move(pg)) {}

  // Rank 0 (or the only process): the one that prints and writes files.
  bool writer() const { return !pg_ || pg_->rank() == 0; }

  // --resume: reads <out>/train_state.safetensors and checks that it was
  // written by a run with the same hyper-parameters and device. Returns the
  // phase to resume ("float" or "qat"); Trainer::run restores the rest.
  std::string open_resume() {
    const std::string path = train_state_path(f_.out);
    if (!std::filesystem::exists(path))
      throw std::runtime_error("--resume: no checkpoint to resume from in '" + f_.out + "' (expected " + path +
                               ", written by a run with --checkpoint-every N)");
    resume_ = read_train_state(path);
    state_ = nlohmann::json::parse(resume_->state_json, nullptr, false);
    if (state_.is_discarded() || !state_.is_object() || !state_.contains("flags"))
      throw std::runtime_error("--resume: " + path + " holds no valid " + f_.program + " state");
    const auto& saved = state_.at("flags");
    for (auto it = flags_.begin(); it != flags_.end(); ++it) {
      std::string opt = "--" + it.key();
      std::replace(opt.begin(), opt.end(), '_', '-');
      if (!saved.contains(it.key()))
        throw std::runtime_error("--resume: the checkpoint " + path + " does not record " + opt);
      if (saved.at(it.key()) != it.value())
        throw std::runtime_error("--resume: " + opt + " is " + it.value().dump() + " here but " +
                                 saved.at(it.key()).dump() + " in the checkpoint " + path +
                                 "; resume with the options of the interrupted run");
    }
    // (Distributed: each rank on its own device; the kind must match.)
    if (pg_ ? Device::parse(state_.at("device").get<std::string>()).type != dev_.type
            : state_.at("device").get<std::string>() != dev_.str())
      throw std::runtime_error("--resume: the checkpoint " + path + " was written on " +
                               state_.at("device").get<std::string>() + ", this run uses " + dev_.str() +
                               " (a run resumes bit for bit on the device it started on)");
    for (const auto& r : state_.at("records")) records.push_back(record_from(r));
    global_step_ = state_.at("global_step").get<std::int64_t>();
    float_acc = state_.at("float_acc").get<double>();
    std::printf("resuming from %s: %s phase, epoch %d, step %lld of the epoch (global step %lld)\n", path.c_str(),
                state_.at("phase").get<std::string>().c_str(), state_.at("epoch").get<int>(),
                static_cast<long long>(state_.at("batch").get<std::int64_t>()), static_cast<long long>(global_step_));
    return state_.at("phase").get<std::string>();
  }

  // Trains `model` for one phase; records per-epoch metrics. For a QAT
  // phase the observers freeze at ph.freeze_epoch (PyTorch's recipe:
  // fine-tuning observes during its first epoch only), and the first
  // step's graph is written as DOT. A pending --resume of this phase
  // restores the model, the optimizer, the generators, the loader's
  // position and the epoch's running sums, and continues mid-epoch.
  void run(Sequential& model, const Phase& ph, const std::string& out_dir) {
    std::unique_ptr<Optimizer> optimizer;
    if (f_.optimizer == "adamw")
      optimizer = std::make_unique<AdamW>(model.named_parameters(),
                                          AdamWOptions{ph.lr, 0.9, 0.999, 1e-8, f_.weight_decay});
    else
      optimizer = std::make_unique<SGD>(model.named_parameters(),
                                        SGDOptions{ph.lr, f_.momentum, 0.0, f_.weight_decay, f_.nesterov});
    Optimizer& opt = *optimizer;
    const std::int64_t steps = static_cast<std::int64_t>(ph.epochs) * loader_.num_batches();
    CosineSchedule schedule(ph.lr, steps, ph.warmup ? std::min<std::int64_t>(steps / 20, 200) : 0);
    int first_epoch = 1;
    std::int64_t resume_batch = -1;  // >= 0: continue epoch first_epoch at this batch
    RunningStats resumed_stats;
    double resumed_seconds = 0;
    if (resume_ && state_.at("phase").get<std::string>() == ph.name) {
      NamedTensors extra = restore_train_state(*resume_, model, &opt, {{"init", &init_gen_}});
      NamedTensors loader_state, stats_state;
      for (auto& [n, t] : extra)
        (n.rfind("loader.", 0) == 0 ? loader_state : stats_state).emplace_back(n.rfind("loader.", 0) == 0 ? n.substr(7) : n, t);
      loader_.load_state_dict(loader_state);
      resumed_stats.load(state_.at("stats"), stats_state, dev_);
      first_epoch = state_.at("epoch").get<int>();
      resume_batch = state_.at("batch").get<std::int64_t>();
      resumed_seconds = state_.at("epoch_seconds").get<double>();
      if (ph.qat && std::filesystem::exists(out_dir + "/qat_step.dot")) dot_path = out_dir + "/qat_step.dot";
      resume_.reset();
    }
    std::unique_ptr<qgrad::dist::DistributedDataParallel> ddp;
    if (pg_)
      ddp = std::make_unique<qgrad::dist::DistributedDataParallel>(std::shared_ptr<Module>(&model, [](Module*) {}),
                                                                    pg_);
    for (int e = first_epoch; e <= ph.epochs; ++e) {
      const bool resuming = resume_batch >= 0;
      if (ph.qat && e == ph.freeze_epoch && !resuming) enable_observer(model, false);
      // A host flag, set again at every epoch from freeze_bn_epoch on, so a
      // resumed run holds it too.
      if (ph.qat && ph.freeze_bn_epoch > 0 && e >= ph.freeze_bn_epoch) freeze_bn_stats(model);
      const bool observers_on = !(ph.qat && e >= ph.freeze_epoch);
      model.train();
      const auto t0 = Clock::now();
      const double seconds_before = resuming ? resumed_seconds : 0.0;
      Progress bar(ph.name + " " + std::to_string(e) + "/" + std::to_string(ph.epochs), loader_.num_batches());
      RunningStats stats = resuming ? resumed_stats : RunningStats();
      Batch b;
      if (!resuming) loader_.start_epoch();
      std::int64_t i = resuming ? resume_batch : 0;
      resume_batch = -1;
      while (loader_.next(b)) {
        if (f_.augment) b.images = f_.augment(b.images);
        Batch global = b;
        if (pg_) b.images = qgrad::dist::shard_rows(b.images, *pg_), b.labels = qgrad::dist::shard_rows(b.labels, *pg_);
        // The 8da8w recipe's weights fake-quantized in one launch (a no-op without its linears), and
        // under mixed precision the parameters' casts in one more (a no-op without a compute dtype).
        stage_8da8w_weights(model);
        stage_weight_fake_quants(model);  // the int8 recipe's weight observers + fake quants in one launch
        stage_compute_casts(model);
        Tensor logits = ddp ? (*ddp)(b.images) : model(b.images);
        Tensor loss = cross_entropy(logits.to(DType::f32), b.labels);  // f32 loss under --precision bf16
        if (ph.qat && e == 1 && i == 0 && writer()) write_graph(loss, out_dir);
        opt.zero_grad();
        loss.backward();
        if (f_.abort_at_step > 0 && global_step_ + 1 == f_.abort_at_step) {
          std::printf("--abort-at-step %lld: SIGKILL during the step\n", static_cast<long long>(f_.abort_at_step));
          std::fflush(stdout);
          ::kill(::getpid(), SIGKILL);
        }
        if (f_.clip_grad_norm > 0) clip_grad_norm(opt, f_.clip_grad_norm);
        schedule.apply(opt);
        opt.step();
        if (pg_) {  // the global batch's loss and predictions, for the same metrics as one process
          Tensor l = loss.detach().clone();
          pg_->all_reduce(l, qgrad::dist::ReduceOp::avg);
          stats.add(l, pg_->all_gather(logits.detach()).reshape({global.labels.numel(), logits.size(1)}),
                    global.labels);
        } else {
          stats.add(loss, logits, b.labels);
        }
        ++global_step_;
        if (++i % 25 == 0 || i == loader_.num_batches()) {
          stats.flush();
          bar.update(i, stats.seen(), stats.loss(), stats.accuracy());
        }
        if (f_.checkpoint_every > 0 && global_step_ % f_.checkpoint_every == 0 && writer())
          checkpoint(model, opt, ph, e, i, stats, seconds_before + seconds_since(t0));
      }
      stats.flush();
      bar.finish();
      const double secs = seconds_before + seconds_since(t0);
      model.eval();
      last_test_pred = ph.qat ? predict_qat(model, test_, dev_, observers_on) : predict(model, test_, dev_);
      const double test_acc = accuracy(last_test_pred, test_);
      records.push_back({e, ph.name, stats.loss(), stats.accuracy(), test_acc, secs});
      std::printf("%-5s epoch %2d/%d  loss %.4f  train acc %6.2f%%  test acc %6.2f%%  %6.1f s  %7.0f samples/s\n",
                  ph.name.c_str(), e, ph.epochs, stats.loss(), 100 * stats.accuracy(), 100 * test_acc, secs,
                  static_cast<double>(stats.seen()) / secs);
      std::fflush(stdout);
    }
    if (ph.qat) enable_observer(model, false);
  }

  std::vector<EpochRecord> records;
  // The test-set predictions of the last epoch (eval mode, observers off):
  // run_flow's final accuracies reuse them instead of another pass.
  std::vector<std::int64_t> last_test_pred;
  // Whether this process's last epoch was of `phase` and left its predictions
  // of `test` (not so after a resume that ran no epoch of it).
  bool evaluated_last(const std::string& phase, const Dataset& test) const {
    return !records.empty() && records.back().phase == phase &&
           static_cast<std::int64_t>(last_test_pred.size()) == test.size();
  }
  std::string dot_path, dot_svg;
  double float_acc = 0;  // set by the caller after the float phase; saved in the training state

 private:
  void write_graph(const Tensor& loss, const std::string& out_dir) {
    dot_path = out_dir + "/qat_step.dot";
    write_dot(loss, dot_path);
    if (on_path("dot") && render_dot(dot_path, out_dir + "/qat_step.svg")) dot_svg = out_dir + "/qat_step.svg";
  }

  // Everything the rest of the run depends on, after `batch` steps of epoch
  // `epoch` of phase ph: see nn::save_train_state for the tensors; the JSON
  // holds the phase, the position, the metrics so far and the flags.
  void checkpoint(const Sequential& model, const Optimizer& opt, const Phase& ph, int epoch, std::int64_t batch,
                  RunningStats& stats, double epoch_seconds) {
    NamedTensors extra;
    for (const auto& [n, t] : loader_.state_dict()) extra.emplace_back("loader." + n, t);
    nlohmann::json state;
    state["flags"] = flags_;
    state["device"] = dev_.str();
    state["phase"] = ph.name;
    state["epoch"] = epoch;
    state["batch"] = batch;
    state["global_step"] = global_step_;
    state["stats"] = stats.save(extra);
    state["epoch_seconds"] = epoch_seconds;
    state["float_acc"] = float_acc;
    nlohmann::json recs = nlohmann::json::array();
    for (const auto& r : records) recs.push_back(record_json(r));
    state["records"] = recs;
    save_train_state(train_state_path(f_.out), model, &opt, {{"init", &init_gen_}}, extra, state.dump());
  }

  TrainOptions f_;
  Device dev_;
  const Dataset& train_;
  const Dataset& test_;
  Generator& init_gen_;
  nlohmann::json flags_;  // the hyper-parameters (report.json's "flags"), checked on resume
  DataLoader loader_;
  std::optional<TrainStateFile> resume_;
  nlohmann::json state_;
  std::int64_t global_step_ = 0;
  std::shared_ptr<qgrad::dist::ProcessGroup> pg_;
};

// The float -> QAT -> int8 flow of the QAT examples: the float phase
// (unless qat_from_scratch, or a --resume into the QAT phase), `prepare`
// (prepare_qat and whatever else the model wants), the QAT phase, the QAT
// model's test accuracy with its observers off, convert, the int8 model's
// accuracy and its agreement with the QAT model. Writes
// <out>/{float,qat,int8}.safetensors.
struct FlowOptions {
  int epochs = 6, qat_epochs = 2;
  double lr = 0.05, qat_lr = 0.005;
  bool qat_from_scratch = false, resume = false;
  int freeze_bn_epoch = 0;  // QAT fine-tuning: freeze_bn_stats from this epoch on (0: never)
  std::string out;
  std::string int8_format;  // the int8 checkpoint's "format" metadata
  // The QAT recipe (nn/recipes.h): its name keys the converted model in the
  // report and names its checkpoint (<out>/<recipe>.safetensors); convert,
  // the fake-quant switch and the checkpoint's metadata default to the int8
  // recipe's (nn::convert, nn::enable_fake_quant, {"format": int8_format}).
  std::string recipe = "int8";
  std::function<std::shared_ptr<Sequential>(Sequential&)> convert;
  std::function<void(Sequential&, bool)> enable_fake_quant;
  std::function<Metadata(const Sequential&)> converted_metadata;
};
struct FlowResult {
  std::string recipe = "int8";  // the converted model's name: int8, 8da4w, fp8
  double float_acc = 0, qat_acc = 0, int8_acc = 0, agreement = 0;
  std::size_t float_bytes = 0, int8_bytes = 0;
  std::shared_ptr<Sequential> int8;  // the converted model
};
FlowResult run_flow(Trainer& trainer, Sequential& model, const FlowOptions& o, const Dataset& test, Device dev,
                    const std::function<void(Sequential&)>& prepare);

// report.json (the same keys for every example; "timing" is the only part
// that differs between identical runs) and the closing summary on stdout.
// The converted model's keys carry the recipe's name ("int8_acc",
// "8da4w_vs_qat_agreement", ...); `extra` is merged after "recipe".
void write_report(const std::string& path, const FlowResult& r, Device dev, std::uint64_t seed,
                  std::int64_t train_examples, std::int64_t test_examples, const std::vector<EpochRecord>& records,
                  const std::string& flags_text, Clock::time_point t_start,
                  const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());
void print_summary(const FlowResult& r, bool qat_from_scratch, const std::string& report_path, const std::string& out,
                   const std::vector<std::string>& plots, const Trainer& trainer, Clock::time_point t_start,
                   const std::vector<std::string>& onnx_files = {});

}  // namespace qgrad_examples
