// Enums shared with Python (deep_kernels/quant/common.py mirrors them by value).
#pragma once

namespace deep_kernels {

// Where the scale of (row m, group g) lives; M_ALIGNED is M rounded up to 4 (16 bytes of FP32 or int32).
enum class ScaleLayout : int {
    RowMajor = 0,            // FP32 [M, G], offset m * G + g
    MNMajor = 1,             // FP32 [M, G] with strides (1, M_ALIGNED): what the FP8 GEMM reads via TMA
    MNMajorPackedUE8M0 = 2,  // int32 [M, ceil(G / 4)], strides (1, M_ALIGNED); byte g % 4 holds group g's exponent
};

// How a value is brought into e4m3 range before rounding.
enum class ScaleMode : int {
    Multiply = 0,  // q = RNE(x * (448 / amax)), or x * (1 / scale) with UE8M0 scales
    Divide = 1,    // q = RNE(x / scale), scale = amax / 448 (the serving engines' convention)
};

}  // namespace deep_kernels
