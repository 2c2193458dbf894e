// Attributes, assertions and compile-time helpers shared by every kernel header.
#pragma once

#define DK_DEVICE __device__ __forceinline__
#define DK_HOST_DEVICE __host__ __device__ __forceinline__

#define DK_STATIC_ASSERT(cond, reason) static_assert(cond, reason)

// NOTE: trap (not assert) so the check survives -DNDEBUG and surfaces as a launch error in Python.
#define DK_DEVICE_ASSERT(cond)                                                                   \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            printf("deep_kernels device assertion failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            asm volatile("trap;");                                                               \
        }                                                                                        \
    } while (0)
