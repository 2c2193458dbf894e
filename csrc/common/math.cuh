// Integer helpers used by kernels and tile arithmetic.
#pragma once

#include "common/macros.cuh"

namespace deep_kernels {

template <typename T>
DK_HOST_DEVICE constexpr T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

template <typename T>
DK_HOST_DEVICE constexpr T align_up(T a, T b) {
    return ceil_div(a, b) * b;
}

}  // namespace deep_kernels
