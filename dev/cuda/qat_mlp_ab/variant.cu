// One version of the fused QAT MLP kernel under renamed entry points
// (VARIANT = a or b, KERNEL_FILE = its source), for main.cu.
#define QGRAD_AB_CAT2(x, y) x##y
#define QGRAD_AB_CAT(x, y) QGRAD_AB_CAT2(x, y)
#define qat_mlp_available QGRAD_AB_CAT(qat_mlp_available_, VARIANT)
#define qat_mlp_plan QGRAD_AB_CAT(qat_mlp_plan_, VARIANT)
#define qat_mlp_forward_backward QGRAD_AB_CAT(qat_mlp_forward_backward_, VARIANT)
#define qat_mlp_record_phases QGRAD_AB_CAT(qat_mlp_record_phases_, VARIANT)
#include KERNEL_FILE
