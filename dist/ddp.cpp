#include "qgrad/dist/ddp.h"

#include <cstring>
#include <functional>
#include <random>

#include "qgrad/autograd/node.h"
#include "qgrad/core/memory.h"
#include "qgrad/nn/quant.h"
#include "qgrad/ops/factory.h"

namespace qgrad::dist {

namespace {
const char* kOp = "DistributedDataParallel";

// Calls f on m and every module under it, but for the subtrees of QAT
// modules' weight fake quants ("weight_fake_quant", nn/qat.h, nn/qat_conv.h).
void for_each_module_but_weight_quant(nn::Module& m, const std::function<void(nn::Module&)>& f) {
  f(m);
  for (auto& [n, c] : m.named_children())
    if (n != "weight_fake_quant") for_each_module_but_weight_quant(*c, f);
}

char* bytes_at(const Tensor& t, std::int64_t element) {
  return static_cast<char*>(t.data_ptr()) + static_cast<std::size_t>(element) * dtype_size(t.dtype());
}
}  // namespace

void broadcast_state(nn::Module& module, ProcessGroup& group, int root) {
  // Every rank must hold the same layout, or the broadcasts would pair up
  // wrongly: compare (entries, total elements) first.
  const nn::NamedTensors state = module.state_dict();
  std::int64_t total = 0;
  for (const auto& [n, t] : state) total += t.numel();
  // (On the model's device: a CUDA model's group may have NCCL alone.)
  const Device dev = state.empty() ? Device::cpu() : state.front().second.device();
  Tensor mine = Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(state.size()), total}, {2}, dev);
  Tensor all = group.all_gather(mine);
  const std::vector<std::int64_t> v = all.to_vector<std::int64_t>();
  for (int r = 0; r < group.world_size(); ++r)
    QGRAD_CHECK(v[2 * r] == v[0] && v[2 * r + 1] == v[1], kOp, "module", "rank ", r, " has ", v[2 * r],
                " parameters and buffers of ", v[2 * r + 1], " elements, rank 0 has ", v[0], " of ", v[1],
                " (every rank must build the same model)");
  for (const auto& [n, t] : state) group.broadcast(t, root);
}

void sync_observer_ranges(nn::Module& module, const std::shared_ptr<ProcessGroup>& group) {
  // A weight's observer sees the same tensor on every rank (DDP keeps the
  // weights bit-identical), so its range is already the same everywhere:
  // syncing it would be two collectives per layer and step for nothing, and
  // would unfuse its observe-and-fake-quantize.
  for_each_module_but_weight_quant(module, [&](nn::Module& m) {
    auto* obs = dynamic_cast<nn::Observer*>(&m);
    if (!obs) return;
    if (!group) {
      obs->set_range_sync(nullptr);
      return;
    }
    ProcessGroup* g = group.get();
    obs->set_range_sync([g](const Tensor& min_val, const Tensor& max_val) {
      g->all_reduce(min_val, ReduceOp::min);
      g->all_reduce(max_val, ReduceOp::max);
    });
  });
}

struct DistributedDataParallel::Impl {
  struct Bucket {
    std::vector<std::size_t> members;  // indices into params
    std::vector<std::int64_t> offsets;  // element offsets in flat
    std::int64_t numel = 0;
    Tensor flat;
    std::size_t ready = 0;
    std::shared_ptr<Work> work;
  };
  ProcessGroup* group = nullptr;
  DDPOptions options;
  std::vector<std::string> names;
  std::vector<Tensor> params;  // reverse registration order, requiring grad
  std::vector<std::size_t> bucket_of;
  std::vector<std::uint64_t> hooks;
  std::vector<Bucket> buckets;
  std::size_t next_launch = 0;
  std::int64_t syncs = 0;

  void clear() {
    for (std::size_t i = 0; i < params.size(); ++i) remove_post_accumulate_grad_hook(params[i], hooks[i]);
    params.clear();
    names.clear();
    hooks.clear();
    buckets.clear();
    bucket_of.clear();
    next_launch = 0;
  }

  void build(const nn::NamedTensors& named) {
    clear();
    for (auto it = named.rbegin(); it != named.rend(); ++it) {
      if (!it->second.requires_grad()) continue;
      names.push_back(it->first);
      params.push_back(it->second);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      QGRAD_CHECK(is_floating(p.dtype()), kOp, names[i], "parameters must be floating, got ", dtype_name(p.dtype()));
      const std::size_t bytes = p.nbytes();
      bool fresh = buckets.empty();
      if (!fresh) {
        const Bucket& b = buckets.back();
        const Tensor& first = params[b.members.front()];
        fresh = first.dtype() != p.dtype() || first.device() != p.device() ||
                static_cast<std::size_t>(b.numel) * dtype_size(p.dtype()) + bytes > options.bucket_cap_bytes;
      }
      if (fresh) buckets.emplace_back();
      Bucket& b = buckets.back();
      b.members.push_back(i);
      b.offsets.push_back(b.numel);
      b.numel += p.numel();
      bucket_of.push_back(buckets.size() - 1);
    }
    for (Bucket& b : buckets) {
      const Tensor& first = params[b.members.front()];
      b.flat = Tensor::empty({b.numel}, TensorOptions{}.with_dtype(first.dtype()).with_device(first.device()));
    }
    for (std::size_t i = 0; i < params.size(); ++i)
      hooks.push_back(add_post_accumulate_grad_hook(params[i], [this, i] { on_grad_ready(i); }));
  }

  bool same_layout(const nn::NamedTensors& named) const {
    std::size_t k = 0;
    for (auto it = named.rbegin(); it != named.rend(); ++it) {
      if (!it->second.requires_grad()) continue;
      if (k >= params.size() || params[k].impl() != it->second.impl()) return false;
      ++k;
    }
    return k == params.size();
  }

  bool mid_sync() const {
    if (next_launch > 0) return true;
    for (const Bucket& b : buckets)
      if (b.ready > 0) return true;
    return false;
  }

  void on_grad_ready(std::size_t i) {
    Bucket& b = buckets[bucket_of[i]];
    ++b.ready;
    // Launch in bucket order (every rank issues the same sequence).
    while (next_launch < buckets.size() && buckets[next_launch].ready == buckets[next_launch].members.size())
      launch(buckets[next_launch++]);
    if (next_launch == buckets.size()) finish();
  }

  void launch(Bucket& b) {
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      const Tensor& p = params[b.members[k]];
      Tensor g = p.grad();
      if (!g.defined()) g = zeros(p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(p.device()));
      QGRAD_CHECK(g.dtype() == p.dtype() && g.device() == p.device(), kOp, names[b.members[k]],
                  "gradient of dtype ", dtype_name(g.dtype()), " on ", g.device().str(), " for a parameter of ",
                  dtype_name(p.dtype()), " on ", p.device().str());
      memory::copy(bytes_at(b.flat, b.offsets[k]), p.device(), g.data_ptr(), g.device(), g.nbytes());
    }
    b.work = group->all_reduce_async(b.flat, ReduceOp::avg);
  }

  void finish() {
    for (Bucket& b : buckets) {
      b.work->wait();
      b.work.reset();
    }
    for (Bucket& b : buckets) {
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        Tensor& p = params[b.members[k]];
        Tensor g = Tensor::empty(p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(p.device()));
        memory::copy(g.data_ptr(), p.device(), bytes_at(b.flat, b.offsets[k]), p.device(), g.nbytes());
        p.set_grad(g);
      }
      b.ready = 0;
    }
    next_launch = 0;
    ++syncs;
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : impl_(std::make_unique<Impl>()), module_(std::move(module)), group_(std::move(group)) {
  QGRAD_CHECK(module_ != nullptr, kOp, "module", "null module");
  QGRAD_CHECK(group_ != nullptr, kOp, "group", "null process group");
  QGRAD_CHECK(options.bucket_cap_bytes > 0, kOp, "bucket_cap_bytes", "must be positive");
  register_module("module", module_);
  impl_->group = group_.get();
  impl_->options = options;
  if (options.broadcast_buffers) {
    broadcast_state(*module_, *group_, 0);
  } else {
    // Parameters only (same layout check through a temporary wrapper).
    for (const auto& [n, t] : module_->named_parameters()) group_->broadcast(t, 0);
  }
  if (options.sync_observers) sync_observer_ranges(*module_, group_);
  impl_->build(module_->named_parameters());
}

DistributedDataParallel::~DistributedDataParallel() {
  impl_->clear();
  if (impl_->options.sync_observers) sync_observer_ranges(*module_, nullptr);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  Impl& m = *impl_;
  if (m.mid_sync()) {
    std::string missing;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const auto& b = m.buckets[m.bucket_of[i]];
      if (b.ready < b.members.size()) missing += (missing.empty() ? "" : ", ") + m.names[i];
    }
    m.next_launch = 0;
    for (auto& b : m.buckets) {
      if (b.work) b.work->wait();
      b.work.reset();
      b.ready = 0;
    }
    QGRAD_CHECK(false, kOp, "module",
                "the previous backward left gradients unreduced: parameters of these buckets got no gradient "
                "(every parameter requiring grad must be used in every step): ",
                missing);
  }
  const nn::NamedTensors named = module_->named_parameters();
  if (!m.same_layout(named)) m.build(named);
  return module_->forward(x);
}

std::vector<std::size_t> DistributedDataParallel::bucket_sizes() const {
  std::vector<std::size_t> out;
  for (const auto& b : impl_->buckets) out.push_back(b.members.size());
  return out;
}

std::int64_t DistributedDataParallel::sync_count() const { return impl_->syncs; }

Tensor shard_rows(const Tensor& t, const ProcessGroup& group) {
  const char* op = "shard_rows";
  QGRAD_CHECK(t.defined() && t.dim() >= 1, op, "t", "expected a tensor of at least one dimension");
  QGRAD_CHECK(!is_packed_int4(t.dtype()), op, "t", "packed int4 rows cannot be split");
  const std::int64_t n = t.size(0), w = group.world_size();
  QGRAD_CHECK(n % w == 0, op, "t", "the global batch of ", n, " rows does not split evenly over ", w,
              " ranks (choose a batch, and a data size, divisible by the world size)");
  Shape s = t.shape();
  s[0] = n / w;
  Tensor out = Tensor::empty(s, TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()));
  memory::copy(out.data_ptr(), t.device(), bytes_at(t, group.rank() * out.numel()), t.device(), out.nbytes());
  return out;
}

// ---- DistributedSampler ----

DistributedSampler::DistributedSampler(std::int64_t size, int world_size, int rank, bool shuffle, std::uint64_t seed,
                                       bool drop_last)
    : size_(size), world_(world_size), rank_(rank), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
  const char* op = "DistributedSampler";
  QGRAD_CHECK(size >= 0, op, "size", "must be >= 0, got ", size);
  QGRAD_CHECK(world_size >= 1, op, "world_size", "must be >= 1, got ", world_size);
  QGRAD_CHECK(rank >= 0 && rank < world_size, op, "rank", "must be in [0, ", world_size, "), got ", rank);
  // torch: drop_last and an uneven split -> ceil((N - W) / W), else ceil(N / W).
  if (drop_last && size % world_size != 0) num_samples_ = (size - world_size + world_size - 1) / world_size;
  else num_samples_ = (size + world_size - 1) / world_size;
  if (num_samples_ < 0) num_samples_ = 0;
}

void DistributedSampler::set_epoch(std::int64_t epoch) {
  QGRAD_CHECK(epoch >= 0, "DistributedSampler::set_epoch", "epoch", "must be >= 0, got ", epoch);
  epoch_ = epoch;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  std::vector<std::int64_t> all(static_cast<std::size_t>(size_));
  for (std::int64_t i = 0; i < size_; ++i) all[static_cast<std::size_t>(i)] = i;
  if (shuffle_ && size_ > 1) {
    std::mt19937_64 gen(seed_ + static_cast<std::uint64_t>(epoch_));
    for (std::int64_t i = size_ - 1; i > 0; --i) {
      const auto j = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(i + 1));
      std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(j)]);
    }
  }
  const std::int64_t total = total_size();
  if (drop_last_) {
    all.resize(static_cast<std::size_t>(total));
  } else if (size_ > 0) {
    for (std::int64_t k = 0; static_cast<std::int64_t>(all.size()) < total; ++k)
      all.push_back(all[static_cast<std::size_t>(k % size_)]);
  }
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(num_samples_));
  for (std::int64_t i = rank_; i < total; i += world_) out.push_back(all[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace qgrad::dist
