// What a GEMM engine instantiation multiplies: the operands' formats and how they are scaled. One traits field
// (Sm90Fp8GemmTraits::kOperands) that the producer (what a stage holds), the mainloop (which wgmma, which
// promotion) and the host read.
#pragma once

#include <cstdint>

namespace deep_kernels {

enum class GemmOperands : uint32_t {
    // e4m3 A with 1x128 scales, e4m3 B with 128x128 block scales (DeepSeek-V3 inference recipe (1, 128, 128)).
    Fp8BlockScaled = 0,
    // e4m3 A and B, both with 1x128 scales (the weight-gradient recipe (1, 1, 128)).
    Fp8ChannelScaled = 1,
    // bf16 A and B, no scales: the accumulators are the result.
    Bf16 = 2,
    // e4m3 A with 1x128 scales, e2m1 B with UE8M0 scales per 1x32 (MXFP4), expanded to e4m3 on chip.
    Fp8Mxfp4 = 3,
};

}  // namespace deep_kernels
