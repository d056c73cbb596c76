// CUDA against CPU, bit for bit, for every quantization op and lerp: random
// inputs, exact halves, +-inf, NaN and the range edges; forward and backward;
// sizes that exercise the vectorised path, the scalar tail and misaligned
// views; device-resident qparams. All tests skip without a GPU.
#include <limits>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/quantize.h"
#include "test_quant_ref.h"

using namespace qgrad;
using namespace qgrad::testing;
using namespace qref;

namespace {

// Random values mixed with ties, specials and the edges of [qmin, qmax]
// for a (power-of-two) scale s and zero point zp.
Tensor mixed_input(std::int64_t n, DType dt, double s, std::int64_t zp, std::int64_t qmin, std::int64_t qmax,
                   std::uint64_t seed) {
  Tensor r = random_input({n}, DType::f64, seed, (qmax - qmin) * s * 0.4);
  auto v = r.to_vector<double>();
  const std::vector<double> special{INFINITY, -INFINITY, NAN, 0.0, -0.0,
                                    (qmin - zp) * s, (qmax - zp) * s, (qmin - zp - 0.5) * s, (qmax - zp + 0.5) * s,
                                    (qmin - zp + 0.5) * s, (qmax - zp - 0.5) * s, (qmin - zp - 1) * s, (qmax - zp + 1) * s,
                                    0.5 * s, -0.5 * s, 1.5 * s, -2.5 * s, 1e30, -1e30};
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i % 3 == 0) v[i] = special[(i / 3) % special.size()];
    else if (i % 3 == 1) v[i] = (std::floor(v[i] / s) + 0.5) * s;  // an exact tie
  }
  return Tensor::from_vector(v, {n}).to(dt);
}

Tensor leaf_on(const Tensor& t, Device dev) {
  Tensor l = t.detach().to(dev).clone();
  l.set_requires_grad(true);
  return l;
}

// Runs fn on CPU and CUDA copies of `inputs` (all made leaves where
// floating), backward with dy; checks outputs and gradients bit for bit.
void same_on_both(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                  const Tensor& dy) {
  std::vector<Tensor> grads[2];
  Tensor outs[2];
  for (int d = 0; d < 2; ++d) {
    const Device dev = d == 0 ? Device::cpu() : Device::cuda();
    std::vector<Tensor> in;
    for (const Tensor& t : inputs)
      in.push_back(is_floating(t.dtype()) ? leaf_on(t, dev) : t.to(dev));
    outs[d] = fn(in);
    if (dy.defined()) outs[d].backward(dy.to(dev));
    for (const Tensor& t : in) grads[d].push_back(t.requires_grad() ? t.grad() : Tensor());
  }
  REQUIRE(bit_equal(outs[0], outs[1]));
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    REQUIRE(grads[0][i].defined() == grads[1][i].defined());
    if (grads[0][i].defined()) CHECK_MESSAGE(bit_equal(grads[0][i], grads[1][i]), "gradient of input ", i);
  }
}

const std::int64_t kSizes[] = {1, 5, 127, 128, 131, 4096 + 3, 100003};

}  // namespace

TEST_CASE("CUDA fake_quantize_per_tensor is bit-identical to the CPU (random, halves, inf, NaN, edges)") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : kFloatTypes)
    for (std::int64_t n : kSizes) {
      Tensor x = mixed_input(n, dt, 0.125, 3, -128, 127, static_cast<std::uint64_t>(n));
      Tensor dy = random_input({n}, dt, 5);
      same_on_both([](const std::vector<Tensor>& in) { return fake_quantize_per_tensor(in[0], 0.125, 3, -128, 127); },
                   {x}, dy);
      same_on_both([](const std::vector<Tensor>& in) { return fake_quantize_per_tensor(in[0], 0.0371, 0, 0, 255); },
                   {x}, dy);
    }
}

TEST_CASE("CUDA fake_quantize_per_tensor with device-resident qparams equals host scalars") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    Tensor x = mixed_input(10007, dt, 0.25, -2, -8, 7, 3).cuda();
    Tensor s = full({1}, 0.25, TensorOptions{}.with_device(Device::cuda()));
    Tensor z = full({1}, -2, TensorOptions{}.with_dtype(DType::s32).with_device(Device::cuda()));
    CHECK(bit_equal(fake_quantize_per_tensor(x, s, z, -8, 7), fake_quantize_per_tensor(x, 0.25, -2, -8, 7)));
    CHECK(bit_equal(fake_quantize_per_tensor(x, s, z, -8, 7), fake_quantize_per_tensor(x.cpu(), 0.25, -2, -8, 7)));
  }
}

TEST_CASE("CUDA fake quantize with unchecked device qparams stays in bounds") {
  QGRAD_REQUIRE_GPU();
  Tensor x = random_input({1000}, DType::f32, 1).cuda();
  const TensorOptions f = TensorOptions{}.with_device(Device::cuda());
  const TensorOptions i = TensorOptions{}.with_dtype(DType::s32).with_device(Device::cuda());
  // zero scale, NaN scale, a zero point far out of range: no fault, no hang
  fake_quantize_per_tensor(x, full({1}, 0.0, f), full({1}, 0, i), -8, 7);
  fake_quantize_per_tensor(x, full({1}, NAN, f), full({1}, 0, i), -8, 7);
  fake_quantize_per_tensor(x, full({1}, 0.1, f), full({1}, 2000000000, i), -8, 7);
  cuda_synchronize();
  CHECK(true);
}

TEST_CASE("CUDA fake_quantize_per_channel is bit-identical to the CPU on every axis") {
  QGRAD_REQUIRE_GPU();
  const std::vector<Shape> shapes{{37}, {8, 129}, {3, 4, 5}, {2, 3, 4, 33}, {64, 256}};
  for (const Shape& shape : shapes)
    for (std::int64_t axis = -static_cast<std::int64_t>(shape.size()); axis < static_cast<std::int64_t>(shape.size()); ++axis) {
      const std::int64_t ax = axis < 0 ? axis + static_cast<std::int64_t>(shape.size()) : axis;
      const std::int64_t c = shape[static_cast<std::size_t>(ax)];
      Generator g(static_cast<std::uint64_t>(c + 100 * ax));
      Tensor scale = rand({c}, g, TensorOptions{}, 0.01, 0.3);
      Tensor zp = randint(-5, 6, {c}, g, TensorOptions{}.with_dtype(DType::s32));
      for (DType dt : kFloatTypes) {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        Tensor x = mixed_input(n, dt, 0.125, 0, -16, 15, 9).reshape(shape);
        same_on_both(
            [&](const std::vector<Tensor>& in) { return fake_quantize_per_channel(in[0], in[1], in[2], axis, -16, 15); },
            {x, scale, zp}, random_input(shape, dt, 10));
      }
    }
}

TEST_CASE("CUDA fake quantize with an inner size not a multiple of 4 finds the channel per element") {
  QGRAD_REQUIRE_GPU();
  // inner = 5: a lane's four elements can span two channels; 105 elements: a partial last block.
  Tensor x = mixed_input(3 * 7 * 5, DType::f32, 0.25, 1, -8, 7, 4).reshape({3, 7, 5});
  Tensor s = full({7}, 0.25), z = full({7}, 1, TensorOptions{}.with_dtype(DType::s32));
  same_on_both([&](const std::vector<Tensor>& in) { return fake_quantize_per_channel(in[0], in[1], in[2], 1, -8, 7); },
               {x, s, z}, random_input({3, 7, 5}, DType::f32, 2));
}

TEST_CASE("CUDA quantize / dequantize (tensor, channel, token, group) are bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  Generator g(5);
  for (DType qt : {DType::s8, DType::u8}) {
    const std::int64_t qmin = quant_min_of(qt), qmax = quant_max_of(qt), zp = qt == DType::s8 ? 0 : 128;
    for (DType dt : kFloatTypes) {
      Tensor x = mixed_input(64 * 96, dt, 0.0625, zp, qmin, qmax, 6).reshape({64, 96});
      Tensor dy = random_input({64, 96}, DType::f32, 7);
      same_on_both([&](const std::vector<Tensor>& in) {
        return dequantize_per_tensor(quantize_per_tensor(in[0], 0.0625, zp, qt), 0.0625, zp, DType::f32);
      }, {x}, dy);
      Tensor sc = rand({96}, g, TensorOptions{}, 0.01, 0.1), zc = full({96}, zp, TensorOptions{}.with_dtype(DType::s32));
      same_on_both([&](const std::vector<Tensor>& in) {
        return dequantize_per_channel(quantize_per_channel(in[0], in[1], in[2], 1, qt), in[1], in[2], 1, DType::f32);
      }, {x, sc, zc}, dy);
      Tensor st = rand({64}, g, TensorOptions{}, 0.01, 0.1), zt = full({64}, zp, TensorOptions{}.with_dtype(DType::s32));
      same_on_both([&](const std::vector<Tensor>& in) {
        return dequantize_per_token(quantize_per_token(in[0], in[1], in[2], qt), in[1], in[2], DType::f32);
      }, {x, st, zt}, dy);
      Tensor sg = rand({64, 3}, g, TensorOptions{}, 0.01, 0.1), zg = full({64, 3}, zp, TensorOptions{}.with_dtype(DType::s32));
      same_on_both([&](const std::vector<Tensor>& in) {
        return dequantize_per_group(quantize_per_group(in[0], in[1], in[2], 32, qt), in[1], in[2], 32, DType::f32);
      }, {x, sg, zg}, dy);
      // the integer outputs themselves
      CHECK(bit_equal(quantize_per_group(x, sg, zg, 32, qt), quantize_per_group(x.cuda(), sg.cuda(), zg.cuda(), 32, qt)));
    }
  }
}

TEST_CASE("CUDA per-tensor dequantize and no-grad fake quantize: every size, aligned or not, float and general forms, "
          "bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  // The per-tensor kernel (one vector of four per thread, a scalar tail) and,
  // for views one element off 16-byte alignment, the engine.
  for (DType qt : {DType::s8, DType::u8}) {
    const std::int64_t qmin = quant_min_of(qt), qmax = quant_max_of(qt), zp = qt == DType::s8 ? -3 : 131;
    for (std::int64_t n : kSizes) {
      const Tensor x = mixed_input(n + 1, DType::f32, 0.0625, zp, qmin, qmax, static_cast<std::uint64_t>(n) + 17);
      const Tensor q = quantize_per_tensor(x, 0.0625, zp, qt);
      for (std::int64_t offset : {0, 1}) {
        const Tensor qv = slice(q, 0, offset, offset + n), xv = slice(x, 0, offset, offset + n);
        const Tensor qg = slice(q.cuda(), 0, offset, offset + n), xg = slice(x.cuda(), 0, offset, offset + n);
        for (DType out : {DType::f32, DType::bf16})
          CHECK_MESSAGE(bit_equal(dequantize_per_tensor(qv, 0.0625, zp, out), dequantize_per_tensor(qg, 0.0625, zp, out)),
                        "n ", n, " offset ", offset);
        CHECK_MESSAGE(bit_equal(fake_quantize_per_tensor(xv, 0.0625, zp, qmin, qmax),
                                fake_quantize_per_tensor(xg, 0.0625, zp, qmin, qmax)),
                      "n ", n, " offset ", offset);
      }
    }
  }
  // The int32 range with a zero point past 2^24: no float form, so the
  // per-tensor kernel's general-form loop (one vector a thread, int64 math).
  const std::int64_t qmin = std::numeric_limits<std::int32_t>::min(), qmax = std::numeric_limits<std::int32_t>::max();
  const std::int64_t zp = std::int64_t{1} << 25;
  for (std::int64_t n : kSizes) {
    const Tensor x = mixed_input(n, DType::f32, 0.0625, zp, qmin, qmax, static_cast<std::uint64_t>(n) + 71);
    CHECK_MESSAGE(bit_equal(fake_quantize_per_tensor(x, 0.0625, zp, qmin, qmax),
                            fake_quantize_per_tensor(x.cuda(), 0.0625, zp, qmin, qmax)),
                  "n ", n, " (general form)");
  }
}

TEST_CASE("CUDA LSQ forward and gradients are bit-identical to the CPU (deterministic reduction)") {
  QGRAD_REQUIRE_GPU();
  Generator g(8);
  for (DType dt : kFloatTypes) {
    Tensor x = mixed_input(5 * 9001, dt, 0.03125, 0, -64, 63, 9).reshape({5, 9001});
    Tensor dy = random_input({5, 9001}, dt, 10);
    Tensor s = full({1}, 0.03125), z = full({1}, 1.7);
    same_on_both([](const std::vector<Tensor>& in) {
      return fake_quantize_learnable_per_tensor(in[0], in[1], in[2], -64, 63, 0.5);
    }, {x, s, z}, dy);
    Tensor sc = rand({9001}, g, TensorOptions{}, 0.01, 0.1), zc = rand({9001}, g, TensorOptions{}, -3.0, 3.0);
    same_on_both([](const std::vector<Tensor>& in) {
      return fake_quantize_learnable_per_channel(in[0], in[1], in[2], 1, -64, 63);
    }, {x, sc, zc}, dy);
    Tensor s0 = rand({5}, g, TensorOptions{}, 0.01, 0.1), z0 = rand({5}, g, TensorOptions{}, -3.0, 3.0);
    same_on_both([](const std::vector<Tensor>& in) {
      return fake_quantize_learnable_per_channel(in[0], in[1], in[2], 0, -64, 63);
    }, {x, s0, z0}, dy);
  }
}

TEST_CASE("CUDA lerp forward and backward are bit-identical to the CPU (scalar, tensor, broadcast)") {
  QGRAD_REQUIRE_GPU();
  Generator g(11);
  for (DType dt : kFloatTypes)
    for (std::int64_t n : kSizes) {
      Tensor a = random_input({n}, dt, 12), b = random_input({n}, dt, 13);
      Tensor w = rand({n}, g, TensorOptions{}.with_dtype(dt), -0.5, 1.5);
      Tensor dy = random_input({n}, dt, 14);
      same_on_both([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], 0.3); }, {a, b}, dy);
      same_on_both([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], 0.7); }, {a, b}, dy);
      same_on_both([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], in[2]); }, {a, b, w}, dy);
    }
  Tensor a = random_input({3, 1, 5}, DType::f32, 1), b = random_input({4, 5}, DType::f32, 2);
  Tensor w = rand({1, 4, 1}, g, TensorOptions{}, 0.0, 1.0);
  same_on_both([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], in[2]); }, {a, b, w},
               random_input({3, 4, 5}, DType::f32, 3));
}

TEST_CASE("CUDA gradcheck (f64): lerp") {
  QGRAD_REQUIRE_GPU();
  Generator g(20);
  Tensor a = random_input({3, 4}, DType::f64, 1).cuda(), b = random_input({3, 4}, DType::f64, 2).cuda();
  Tensor w = rand({3, 4}, g, TensorOptions{}.with_dtype(DType::f64), -0.4, 1.4).cuda();
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  w.set_requires_grad(true);
  auto r = gradcheck([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], in[2]); }, {a, b, w});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("CUDA: qparams and operands on another device are rejected before any work") {
  QGRAD_REQUIRE_GPU();
  Tensor x = random_input({4, 3}, DType::f32, 1).cuda();
  const Tensor s_cpu = full({1}, 0.1), z_cpu = full({1}, 0, TensorOptions{}.with_dtype(DType::s32));
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, s_cpu, z_cpu.cuda(), -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, s_cpu.cuda(), z_cpu, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_per_channel(x, full({3}, 0.1), full({3}, 0, TensorOptions{}.with_dtype(DType::s32)).cuda(),
                                            1, -8, 7),
                  Error);
  CHECK_THROWS_AS(quantize_per_tensor(x, s_cpu, z_cpu, DType::s8), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, full({1}, 0.1), full({1}, 0.0).cuda(), -8, 7), Error);
  CHECK_THROWS_AS(lerp(x, x.cpu(), 0.5), Error);
  CHECK_THROWS_AS(lerp(x, x, x.cpu()), Error);
}

TEST_CASE("CUDA gradcheck (f64): dequantize in the scale") {
  QGRAD_REQUIRE_GPU();
  Generator g(21);
  const TensorOptions i32 = TensorOptions{}.with_dtype(DType::s32).with_device(Device::cuda());
  Tensor q = randint(-128, 128, {3, 4, 8}, g, TensorOptions{}.with_dtype(DType::s8)).cuda();
  Tensor zc = full({4}, 2, i32);
  Tensor s = rand({4}, g, TensorOptions{}.with_dtype(DType::f64), 0.01, 0.2).cuda();
  s.set_requires_grad(true);
  auto r = gradcheck([&](const std::vector<Tensor>& in) { return dequantize_per_channel(q, in[0], zc, 1, DType::f64); },
                     {s});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("CUDA writes the same mask words as the CPU (one __ballot_sync per word)") {
  QGRAD_REQUIRE_GPU();
  for (std::int64_t n : kSizes) {
    for (DType dt : kFloatTypes) {
      Tensor x = mixed_input(n, dt, 0.125, 0, -16, 15, static_cast<std::uint64_t>(n) + 5);
      Tensor masks[2];
      for (int d = 0; d < 2; ++d) {
        const Device dev = d == 0 ? Device::cpu() : Device::cuda();
        Tensor xi = x.to(dev);
        Tensor y = Tensor::empty({n}, TensorOptions{}.with_dtype(dt).with_device(dev));
        masks[d] = Tensor::empty({bitmask_words(n)}, TensorOptions{}.with_dtype(DType::s32).with_device(dev));
        kernels::QuantParams p;
        p.source.scale_value = 0.125f;
        p.qmin = -16;
        p.qmax = 15;
        kernels::fake_quantize(xi, y, p, static_cast<std::uint32_t*>(masks[d].data_ptr()));
      }
      REQUIRE(bit_equal(masks[0], masks[1]));
    }
  }
}
