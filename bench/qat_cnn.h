// The CNN of the QAT step benchmark (bench_train_step.cpp) and of the
// example qgrad-qat-cnn: on [B, 1, 28, 28] inputs,
//   Conv(1->W, 3x3, pad 1)-BN-ReLU-MaxPool 2 -> Conv(W->2W, 3x3, pad 1)-BN-ReLU-MaxPool 2
//   -> Flatten -> Linear(2W*7*7 -> 10),
// prepared with prepare_qat (Conv-BN-ReLU fused into ConvBnReLU2d, the
// batch norm folded into the per-channel weight fake quant) and the default
// QAT qconfig; SGD and step() as QatStep (qat_mlp.h).
#pragma once

#include "qat_mlp.h"

namespace qgrad::bench {

struct QatCnn : QatStep {
  QatCnn(Device device, std::int64_t width, Generator& gen, double lr = 0.01) {
    nn::Conv2dOptions same;
    same.padding = {1, 1};
    for (const auto& [in, out] : {std::pair<std::int64_t, std::int64_t>{1, width}, {width, 2 * width}}) {
      model->emplace_back<nn::Conv2d>(in, out, std::array<std::int64_t, 2>{3, 3}, gen, same);
      model->emplace_back<nn::BatchNorm2d>(out);
      model->emplace_back<nn::ReLU>();
      model->emplace_back<nn::MaxPool2d>(2);
    }
    model->emplace_back<nn::Flatten>();
    model->emplace_back<nn::Linear>(2 * width * 7 * 7, 10, gen);
    prepare(device, lr);
  }
};

}  // namespace qgrad::bench
