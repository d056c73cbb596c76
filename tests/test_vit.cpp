// The tiny ViT (nn/vit.h), Module::clone, the SmoothQuant fold
// (smoothquant_fold, smoothquant_encoder_blocks) and the 8da8w recipe on a
// whole ViT: the patch layout, the block against its composition, deep
// copies, the fold's exactness (power-of-two factors) and tolerance, and the
// W8A8 model against the fake-quant model.
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "helpers.h"
#include "qgrad/nn/nn.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

nn::ViTOptions small_vit() {
  nn::ViTOptions o;
  o.patch = 7;
  o.dim = 32;
  o.depth = 2;
  o.heads = 4;
  o.mlp_ratio = 2;
  return o;
}

Tensor images(std::int64_t n, std::uint64_t seed, Device d) {
  Generator g(seed);
  return randn({n, 784}, g).to(d);
}

// An 8da8w-prepared one-block ViT of width 128 on d (rows of 128 and 256,
// which CUDA's batch kernels take; the patch projection's rows of 49 and the
// head's go the composed way), in `compute` where given, and its clone.
struct StagedPair {
  std::shared_ptr<nn::Sequential> a, b;
};
StagedPair staged_pair(Device d, std::uint64_t seed, std::optional<DType> compute = std::nullopt) {
  nn::ViTOptions o = small_vit();
  o.dim = 128;
  o.depth = 1;
  Generator g(seed);
  StagedPair m;
  m.a = nn::make_vit(o, g);
  m.a->to(d);
  if (compute) m.a->set_compute_dtype(*compute);
  nn::prepare_qat(*m.a, nn::Recipe::w8da8);
  m.b = std::dynamic_pointer_cast<nn::Sequential>(m.a->clone());
  REQUIRE(m.b);
  REQUIRE(m.b->compute_dtype() == compute);
  return m;
}

// Two training steps of both models, b's forward preceded by `stage`: the
// same loss and every parameter gradient (f32, defined) bit for bit. The
// second step stages again, the first staging's tensors having been taken.
void check_staged_steps(const StagedPair& m, const Tensor& x, const Tensor& labels,
                        const std::function<void(nn::Module&)>& stage) {
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    m.a->zero_grad();
    m.b->zero_grad();
    const Tensor la = cross_entropy((*m.a)(x).to(DType::f32), labels);
    stage(*m.b);
    const Tensor lb = cross_entropy((*m.b)(x).to(DType::f32), labels);
    CHECK(bit_equal(la, lb));
    la.backward();
    lb.backward();
    const auto pa = m.a->named_parameters(), pb = m.b->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      REQUIRE(pb[i].second.grad().defined());
      CHECK(pb[i].second.grad().dtype() == DType::f32);
      CHECK(bit_equal(pa[i].second.grad(), pb[i].second.grad()));
    }
  }
}

// How many modules of each type_name() sit below `root` (its descendants).
void add_type_counts(const nn::Module& root, std::map<std::string, std::size_t>& counts) {
  for (const auto& [n, c] : root.named_children()) {
    ++counts[c->type_name()];
    add_type_counts(*c, counts);
  }
}
std::map<std::string, std::size_t> type_counts(const nn::Module& root) {
  std::map<std::string, std::size_t> counts;
  add_type_counts(root, counts);
  return counts;
}
std::size_t count_of(const std::map<std::string, std::size_t>& counts, const std::string& type) {
  const auto it = counts.find(type);
  return it == counts.end() ? 0 : it->second;
}

// The first module named `name` below root (depth first), or null.
nn::Module* first_named(nn::Module& root, const std::string& name) {
  for (const auto& [n, c] : root.named_children()) {
    if (n == name) return c.get();
    if (nn::Module* found = first_named(*c, name)) return found;
  }
  return nullptr;
}

// The dotted path of the first module of type `type` below root (depth first), or "".
std::string first_path_of(const nn::Module& root, const std::string& type, const std::string& prefix = "") {
  for (const auto& [n, c] : root.named_children()) {
    if (c->type_name() == type) return prefix + n;
    const std::string p = first_path_of(*c, type, prefix + n + ".");
    if (!p.empty()) return p;
  }
  return "";
}

}  // namespace

TEST_CASE("vit: patch embedding takes row-major P x P patches, tokens row-major over the patch grid") {
  Generator g(1);
  nn::PatchEmbedding pe(8, 4, 16, g);  // 2 x 2 patches of 16 pixels, D = P*P
  CHECK(pe.tokens() == 4);
  CHECK(pe.pos_embed().shape() == Shape{1, 4, 16});
  // proj = identity, no bias, no position: the output is the patches themselves.
  auto& proj = dynamic_cast<nn::Linear&>(*pe.named_children()[0].second);
  std::vector<float> eye(256, 0.0f);
  for (int i = 0; i < 16; ++i) eye[static_cast<std::size_t>(i * 16 + i)] = 1.0f;
  proj.weight().copy_(Tensor::from_vector(eye, {16, 16}));
  proj.bias().copy_(zeros({16}));
  pe.pos_embed().copy_(zeros({1, 4, 16}));
  std::vector<float> px(2 * 64);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>(i);
  NoGradGuard ng;
  const auto y = values(pe(Tensor::from_vector(px, {2, 64})));
  REQUIRE(y.size() == 2 * 4 * 16);
  // Image 1, token 2 = patch row 1, column 0: pixel (4 + r, c) for r, c in [0, 4).
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      CHECK(y[static_cast<std::size_t>((1 * 4 + 2) * 16 + r * 4 + c)] == 64 + (4 + r) * 8 + c);
  // Token 1 of image 0 = patch (0, 1): pixel (r, 4 + c).
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) CHECK(y[static_cast<std::size_t>(1 * 16 + r * 4 + c)] == r * 8 + 4 + c);
  check_error([&] { pe(zeros({2, 63})); }, "PatchEmbedding", "x");
  check_error([&] { nn::PatchEmbedding(28, 5, 16, g); }, "PatchEmbedding", "patch");
}

TEST_CASE("vit: make_vit's structure, names and output; an encoder block equals its composition") {
  for (const Device d : test_devices()) {
    Generator g(2);
    auto m = nn::make_vit(small_vit(), g);
    m->to(d);
    REQUIRE(m->size() == 6);
    CHECK(m->name_at(0) == "embed");
    CHECK(m->name_at(1) == "block0");
    CHECK(m->name_at(2) == "block1");
    CHECK(m->name_at(5) == "head");
    const auto p = m->named_parameters();
    CHECK(p[0].first == "embed.pos_embed");
    CHECK(p[1].first == "embed.proj.weight");
    CHECK(p[3].first == "block0.ln1.weight");
    CHECK(p[5].first == "block0.attn.in_proj.weight");
    // 16 tokens x 32 + proj 49*32+32 + 2 blocks x (2 LN 128 + attn 4*32*32+4*32 + MLP 32*64+64+64*32+32) + LN 64 + head 330.
    std::int64_t n = 0;
    for (const auto& [name, t] : p) n += t.numel();
    CHECK(n == 512 + 1600 + 2 * (128 + 4224 + 4192) + 64 + 330);
    const Tensor x = images(3, 3, d);
    NoGradGuard ng;
    m->eval();
    const Tensor y = (*m)(x);
    CHECK(y.shape() == Shape{3, 10});
    // Block 0 against its composition: x + attn(ln1(x)), then + fc2(gelu(fc1(ln2(.)))), each
    // residual add inside its linear (linear_add: out_proj's and fc2's forward_add).
    const Tensor h0 = (*(*m)[0])(x);
    auto& b = dynamic_cast<nn::EncoderBlock&>(*(*m)[1]);
    const auto& ch = b.named_children();
    auto& attn = dynamic_cast<nn::MultiheadAttention&>(*ch[1].second);
    const Tensor qkv = attn.in_proj()->forward((*ch[0].second)(h0));
    const Tensor h1 = attn.out_proj()->forward_add(packed_attention(qkv, attn.num_heads()), h0);
    const Tensor ref = ch[5].second->forward_add(gelu((*ch[3].second)((*ch[2].second)(h1))), h1);
    CHECK(bit_equal(b(h0), ref));
    // The same values as the adds after the linears, to rounding.
    const Tensor h1_added = add(h0, (*ch[1].second)((*ch[0].second)(h0)));
    const Tensor ref_added = add(h1_added, (*ch[5].second)(gelu((*ch[3].second)((*ch[2].second)(h1_added)))));
    CHECK(max_abs_diff(ref, ref_added) <= 1e-4 * std::max(1.0, max_abs_diff(ref, zeros_like(ref))));
    // The pooled head: mean over tokens of the final norm.
    Tensor h = h0;
    for (std::size_t i = 1; i < 4; ++i) h = (*(*m)[i])(h);
    CHECK(bit_equal((*(*m)[5])(mean(h, 1)), y));
  }
  nn::ViTOptions bad = small_vit();
  bad.heads = 3;
  Generator g(0);
  check_error([&] { nn::make_vit(bad, g); }, "make_vit", "heads");
  bad = small_vit();
  bad.patch = 5;
  check_error([&] { nn::make_vit(bad, g); }, "make_vit", "patch");
  bad = small_vit();
  bad.depth = 0;
  check_error([&] { nn::make_vit(bad, g); }, "make_vit", "depth");
  bad = small_vit();
  bad.dropout = 1.0;
  check_error([&] { nn::make_vit(bad, g); }, "make_vit", "dropout");
  check_error([&] { nn::EncoderBlock(30, 4, 2, g); }, "EncoderBlock", "heads");
  nn::EncoderBlock blk(32, 4, 2, g);
  check_error([&] { blk(zeros({2, 5, 16})); }, "EncoderBlock", "x");
}

TEST_CASE("vit: clone is a deep copy (same outputs, no shared storage, replaced children kept)") {
  for (const Device d : test_devices()) {
    Generator g(4);
    auto m = nn::make_vit(small_vit(), g);
    m->to(d);
    auto c = std::dynamic_pointer_cast<nn::Sequential>(m->clone());
    REQUIRE(c);
    const Tensor x = images(2, 5, d);
    NoGradGuard ng;
    CHECK(bit_equal((*c)(x), (*m)(x)));
    const auto pm = m->state_dict(), pc = c->state_dict();
    REQUIRE(pm.size() == pc.size());
    for (std::size_t i = 0; i < pm.size(); ++i) {
      CHECK(pm[i].first == pc[i].first);
      CHECK(pm[i].second.impl() != pc[i].second.impl());
      CHECK(pc[i].second.device() == d);
      CHECK(pc[i].second.requires_grad());
    }
    const Tensor before = (*c)(x);
    for (auto& [n, t] : m->named_parameters()) t.copy_(zeros_like(t));
    CHECK(bit_equal((*c)(x), before));
    // After prepare_qat the copy holds QAT layers too.
    nn::prepare_qat(*c, nn::Recipe::w8da8);
    auto c2 = c->clone();
    const auto& blk = dynamic_cast<const nn::EncoderBlock&>(*c2->named_children()[1].second);
    CHECK(blk.named_children()[3].second->type_name() == "Int8DynActInt8WeightQATLinear");
    CHECK(bit_equal((*c2)(x), (*c)(x)));
  }
  // A module without clone says so.
  struct Plain : nn::Module {
    Tensor forward(const Tensor& x) override { return x; }
    std::string type_name() const override { return "Plain"; }
  };
  Plain p;
  check_error([&] { p.clone(); }, "Module::clone", "Plain");
}

TEST_CASE("vit: smoothquant_fold keeps the function: bit for bit with power-of-two factors, to rounding otherwise") {
  for (const Device d : test_devices()) {
    Generator g(6);
    nn::LayerNorm ln(Shape{24});
    nn::Linear fc(24, 40, g);
    ln.weight().copy_(randn({24}, g, {}, 1.0, 0.3));
    ln.bias().copy_(randn({24}, g, {}, 0.0, 0.5));
    ln.to(d);
    fc.to(d);
    Generator gx(7);
    const Tensor x = randn({5, 9, 24}, gx, {}, 0.0, 2.0).to(d);
    NoGradGuard ng;
    const Tensor y0 = fc(ln(x));
    const Tensor lw0 = ln.weight().clone(), lb0 = ln.bias().clone(), w0 = fc.weight().clone();
    // Powers of two in [1/8, 8]: every division and product is exact.
    std::vector<float> s2(24);
    for (std::size_t j = 0; j < 24; ++j) s2[j] = std::ldexp(1.0f, static_cast<int>(j % 7) - 3);
    nn::smoothquant_fold(ln, fc, Tensor::from_vector(s2, {24}).to(d));
    CHECK(bit_equal(fc(ln(x)), y0));
    const auto lw = values(ln.weight()), lwv0 = values(lw0), w = values(fc.weight()), wv0 = values(w0);
    for (std::size_t j = 0; j < 24; ++j) CHECK(lw[j] == lwv0[j] / s2[j]);
    for (std::size_t n = 0; n < 40; ++n)
      for (std::size_t j = 0; j < 24; ++j) CHECK(w[n * 24 + j] == wv0[n * 24 + j] * s2[j]);
    // General factors in [0.2, 5]: the same function to f32 rounding.
    Generator gs(8);
    std::vector<float> sv;
    for (double u : values(rand({24}, gs, {}, -1.6, 1.6))) sv.push_back(static_cast<float>(std::exp(u)));
    const Tensor s = Tensor::from_vector(sv, {24}).to(d);
    nn::smoothquant_fold(ln, fc, s);
    const Tensor y1 = fc(ln(x));
    CHECK(!bit_equal(y1, y0));
    CHECK(max_abs_diff(y1, y0) < 1e-5 * (1.0 + max_abs_diff(y0, zeros_like(y0))));
    // Bad input: wrong length, a factor <= 0, a LayerNorm without weight, a mismatched Linear.
    check_error([&] { nn::smoothquant_fold(ln, fc, ones({23}).to(d)); }, "smoothquant_fold", "ln");
    check_error([&] { nn::smoothquant_fold(ln, fc, zeros({24}).to(d)); }, "smoothquant_fold", "s");
    check_error([&] { nn::smoothquant_fold(ln, fc, ones({24, 1}).to(d)); }, "smoothquant_fold", "s");
    nn::LayerNorm bare(Shape{24}, 1e-5, false);
    check_error([&] { nn::smoothquant_fold(bare, fc, ones({24})); }, "smoothquant_fold", "ln");
    nn::Linear other(16, 4, g);
    check_error([&] { nn::smoothquant_fold(ln, other, ones({24})); }, "smoothquant_fold", "next");
  }
}

TEST_CASE("vit: smoothquant_encoder_blocks calibrates and folds every block, the float model unchanged to rounding") {
  for (const Device d : test_devices()) {
    Generator g(10);
    auto m = nn::make_vit(small_vit(), g);
    m->to(d);
    const Tensor x = images(16, 11, d);
    Tensor y0;
    {
      NoGradGuard ng;
      m->eval();
      y0 = (*m)(x);
    }
    m->train();
    const Tensor ln1_before = dynamic_cast<nn::EncoderBlock&>(*(*m)[1]).ln1().weight().clone();
    const std::vector<Tensor> s = nn::smoothquant_encoder_blocks(*m, {images(8, 12, d), images(8, 13, d)}, 0.5);
    CHECK(m->is_training());  // mode restored
    REQUIRE(s.size() == 4);
    for (const Tensor& f : s) {
      CHECK(f.shape() == Shape{32});
      for (double v : values(f)) CHECK((std::isfinite(v) && v > 0));
    }
    // ln1's weight is divided by the first factors.
    const auto lw = values(dynamic_cast<nn::EncoderBlock&>(*(*m)[1]).ln1().weight()), lw0 = values(ln1_before),
               s0 = values(s[0]);
    for (std::size_t j = 0; j < 32; ++j) CHECK(lw[j] == doctest::Approx(lw0[j] / s0[j]).epsilon(1e-6));
    NoGradGuard ng;
    m->eval();
    const Tensor y1 = (*m)(x);
    CHECK(max_abs_diff(y1, y0) < 1e-4);
    // Prepared models and empty calibration sets are refused.
    check_error([&] { nn::smoothquant_encoder_blocks(*m, {}, 0.5); }, "smoothquant_encoder_blocks", "batches");
    check_error([&] { nn::smoothquant_encoder_blocks(*m, {x}, 1.0); }, "smoothquant_encoder_blocks", "alpha");
    nn::prepare_qat(*m, nn::Recipe::w8da8);
    check_error([&] { nn::smoothquant_encoder_blocks(*m, {x}, 0.5); }, "smoothquant_encoder_blocks", "model");
    nn::Sequential plain;
    plain.emplace_back<nn::Linear>(784, 10, g);
    check_error([&] { nn::smoothquant_encoder_blocks(plain, {x}, 0.5); }, "smoothquant_encoder_blocks", "model");
  }
}

TEST_CASE("vit: 8da8w on the whole ViT: every Linear prepared, the W8A8 model agrees with the fake-quant model") {
  for (const Device d : test_devices()) {
    Generator g(14);
    auto m = nn::make_vit(small_vit(), g);
    m->to(d);
    nn::prepare_qat(*m, nn::Recipe::w8da8);
    const auto prepared = type_counts(*m);
    // proj, (in_proj, out_proj, fc1, fc2) per block, head
    CHECK(count_of(prepared, "Int8DynActInt8WeightQATLinear") == 1 + 2 * 4 + 1);
    CHECK(count_of(prepared, "Linear") == 0);
    // One training step reaches every weight through the straight-through estimators.
    const Tensor x = images(32, 15, d);
    m->train();
    Tensor labels = Tensor::from_vector<std::int64_t>(std::vector<std::int64_t>(32, 3), {32}).to(d);
    cross_entropy((*m)(x), labels).backward();
    for (const auto& np : m->named_parameters()) CHECK_MESSAGE(np.second.grad().defined(), np.first);
    auto c = nn::convert(*m, nn::Recipe::w8da8);
    const auto converted = type_counts(*c);
    CHECK(count_of(converted, "Int8DynActInt8WeightLinear") == 10);
    CHECK(count_of(converted, "Int8DynActInt8WeightQATLinear") == 0);
    NoGradGuard ng;
    m->eval();
    const Tensor lq = (*m)(x), lc = (*c)(x);
    // The accumulation differs (exact int32 sums against f32 sums of the same
    // products), so an activation lying within an ulp of a rounding boundary
    // may land one grid step apart in a later layer: most logits agree to
    // 1e-4, the rest within a few grid steps.
    const auto vq = values(lq), vc = values(lc);
    std::size_t close = 0;
    for (std::size_t i = 0; i < vq.size(); ++i) close += std::fabs(vq[i] - vc[i]) < 1e-4;
    CHECK(close >= vq.size() * 9 / 10);
    CHECK(max_abs_diff(lq, lc) < 2e-2);
    const auto pq = values(argmax(lq, 1)), pc = values(argmax(lc, 1));
    std::size_t agree = 0;
    for (std::size_t i = 0; i < pq.size(); ++i) agree += pq[i] == pc[i];
    CHECK(agree >= 31);
  }
}

// stage_8da8w_weights (one fake_quantize_dynamic_batch for the weights) in
// front of a step changes no bit of its loss or gradients.
TEST_CASE("vit: stage_8da8w_weights leaves the 8da8w step's loss and every gradient as they were, bit for bit") {
  for (const Device d : test_devices()) {
    CAPTURE(d.str());
    const StagedPair pair = staged_pair(d, 16);
    const auto& [a, b] = pair;
    const Tensor x = images(8, 17, d);
    const Tensor labels = Tensor::from_vector<std::int64_t>({3, 1, 4, 1, 5, 9, 2, 6}, {8}).to(d);
    check_staged_steps(pair, x, labels, [](nn::Module& root) { nn::stage_8da8w_weights(root); });
    // A staged weight is taken once: the next forward computes its own.
    nn::stage_8da8w_weights(*b);
    NoGradGuard ng;
    const Tensor y1 = (*b)(x), y2 = (*b)(x), y3 = (*a)(x);
    CHECK(bit_equal(y1, y2));
    CHECK(bit_equal(y1, y3));
  }
}

// Mixed precision (bf16 compute, f32 master weights): stage_8da8w_weights
// (which then also casts the fake-quantized weights, one to_batch) and
// stage_compute_casts (the biases', norms' and position embedding's casts,
// one more) in front of a step change no bit of its loss or gradients
// (whose casts back run in the backward's deferred batch); staged casts are
// taken once, and train()/eval() drop what a forward did not take.
TEST_CASE("vit: bf16 mixed precision with the parameters' casts staged: the same loss and gradients, bit for bit") {
  for (const Device d : test_devices()) {
    CAPTURE(d.str());
    const StagedPair pair = staged_pair(d, 18, DType::bf16);
    const auto& [a, b] = pair;
    const Tensor x = images(8, 19, d);
    const Tensor labels = Tensor::from_vector<std::int64_t>({3, 1, 4, 1, 5, 9, 2, 6}, {8}).to(d);
    const std::uint64_t deferred0 = deferred_gradient_pass_count();
    check_staged_steps(pair, x, labels, [](nn::Module& root) {
      nn::stage_8da8w_weights(root);
      nn::stage_compute_casts(root);
    });
    CHECK(deferred_gradient_pass_count() > deferred0);
    // Taken once: a second forward casts for itself, the same values.
    nn::stage_8da8w_weights(*b);
    nn::stage_compute_casts(*b);
    {
      NoGradGuard ng;
      const Tensor y1 = (*b)(x), y2 = (*b)(x), y3 = (*a)(x);
      CHECK(bit_equal(y1, y2));
      CHECK(bit_equal(y1, y3));
    }
    // The staged casts are the parameters as they were when staged (b's
    // forward takes them after its parameters changed: a's output with the
    // old ones); eval() drops casts a forward did not take.
    auto halve = [](nn::Module& m) {
      NoGradGuard ng;
      for (Tensor p : m.parameters()) p.copy_(mul(p, 0.5));
    };
    NoGradGuard ng;
    const Tensor before = (*a)(x);
    nn::stage_8da8w_weights(*b);
    nn::stage_compute_casts(*b);
    halve(*b);
    CHECK(bit_equal((*b)(x), before));
    halve(*a);
    nn::stage_compute_casts(*b);
    halve(*a);
    halve(*b);
    a->eval();
    b->eval();
    CHECK(bit_equal((*b)(x), (*a)(x)));
    CHECK_FALSE(bit_equal((*a)(x), before));
    // set_compute_dtype drops them too.
    nn::stage_compute_casts(*b);
    halve(*a);
    halve(*b);
    b->set_compute_dtype(DType::bf16);
    CHECK(bit_equal((*b)(x), (*a)(x)));
  }
}

// 8da4w and fp8 reach every Linear of the tree as 8da8w does; 8da4w leaves
// the patch projection (49 inputs, no group of 32 divides them) in float
// with skip_indivisible and refuses the model without it, changing nothing.
TEST_CASE("vit: 8da4w and fp8 on the whole ViT: nested Linears prepared, converted, agreeing with fake quant") {
  for (const Device d : test_devices()) {
    for (const nn::Recipe r : {nn::Recipe::w8da4, nn::Recipe::fp8}) {
      const std::string recipe = nn::recipe_name(r);
      CAPTURE(recipe);
      Generator g(24);
      auto m = nn::make_vit(small_vit(), g);
      m->to(d);
      const bool int4 = r == nn::Recipe::w8da4;
      if (int4) {
        check_error([&] { nn::prepare_qat(*m, r); }, "prepare_qat", "group_size");
        CHECK(count_of(type_counts(*m), "Linear") == 10);  // validated before any change
      }
      nn::RecipeOptions o;
      o.skip_indivisible = true;
      nn::prepare_qat(*m, r, o);
      const char* qat = int4 ? "Int8DynActInt4WeightQATLinear" : "Float8QATLinear";
      const auto prepared = type_counts(*m);
      // proj (float for 8da4w), (in_proj, out_proj, fc1, fc2) per block, head
      CHECK(count_of(prepared, qat) == (int4 ? 9u : 10u));
      CHECK(count_of(prepared, "Linear") == (int4 ? 1u : 0u));
      const std::vector<std::string> floats = nn::float_layers(*m);
      CHECK(floats.size() == (int4 ? 1u : 0u));
      check_error([&] { nn::prepare_qat(*m, r, o); }, "prepare_qat", "model");  // already prepared
      // A nested layer computes the recipe's composition: block 0's fc1 on a
      // random input equals linear(fake act, fake weight, bias).
      nn::Module* fc1 = first_named(*m, "fc1");
      REQUIRE(fc1 != nullptr);
      const Tensor w = fc1->named_parameters()[0].second, b = fc1->named_parameters()[1].second;
      Generator gx(25);
      const Tensor xin = randn({3, 5, 32}, gx).to(d);
      const Tensor want = int4 ? linear(nn::fake_quantize_8da4w_activation(xin), nn::fake_quantize_8da4w_weight(w, 32), b)
                               : linear(nn::fake_quantize_fp8_tensor(xin), nn::fake_quantize_fp8_tensor(w), b);
      CHECK(bit_equal(fc1->forward(xin), want));
      // One training step reaches every weight through the straight-through estimators.
      const Tensor x = images(32, 26, d);
      m->train();
      Tensor labels = Tensor::from_vector<std::int64_t>(std::vector<std::int64_t>(32, 3), {32}).to(d);
      cross_entropy((*m)(x), labels).backward();
      for (const auto& np : m->named_parameters()) CHECK_MESSAGE(np.second.grad().defined(), np.first);
      auto c = nn::convert(*m, r);
      const auto converted = type_counts(*c);
      CHECK(count_of(converted, int4 ? "Int8DynActInt4WeightLinear" : "Float8Linear") == (int4 ? 9u : 10u));
      CHECK(count_of(converted, qat) == 0);
      CHECK(count_of(converted, "Linear") == (int4 ? 1u : 0u));
      // Converting with the other recipe names the first layer of this one.
      check_error([&] { nn::convert(*m, int4 ? nn::Recipe::fp8 : nn::Recipe::w8da4); }, "convert",
                  first_path_of(*m, qat));
      NoGradGuard ng;
      m->eval();
      const Tensor lq = (*m)(x), lc = (*c)(x);
      // The inference layers sum exact products in another order (8da4w:
      // int32 group sums; fp8: the FP8 GEMM) than the fake-quant f32 GEMM, so
      // the logits agree to rounding carried through the blocks.
      CHECK(max_abs_diff(lq, lc) < 5e-2);
      const auto pq = values(argmax(lq, 1)), pc = values(argmax(lc, 1));
      std::size_t agree = 0;
      for (std::size_t i = 0; i < pq.size(); ++i) agree += pq[i] == pc[i];
      CHECK(agree >= 31);
    }
  }
}
