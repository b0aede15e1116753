// Stand-ins that let g++ parse CUDA sources for a structure check on a machine
// without nvcc (scripts/wg/syntax-check.sh). Not CUDA semantics: inline asm is
// swallowed, intrinsics are declared only, launches become plain calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <algorithm>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __grid_constant__
#define __restrict__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))
#define ASMV(...) do { } while (0)
using std::min;
using std::max;
struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
struct uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class T> T __ldg(const T*);
template <class T> T __ldcg(const T*);
float __uint_as_float(unsigned);
float __int_as_float(int);
unsigned __float_as_uint(float);
long long __double_as_longlong(double);
unsigned __ballot_sync(unsigned, bool);
int __any_sync(unsigned, int);
int __popc(unsigned);
int __clz(int);
unsigned __byte_perm(unsigned, unsigned, unsigned);
unsigned __reduce_max_sync(unsigned, unsigned);
unsigned __reduce_min_sync(unsigned, unsigned);
int __reduce_min_sync(unsigned, int);
unsigned __match_any_sync(unsigned, int);
int __ffs(int);
template <class T> T __shfl_sync(unsigned, T, int);
template <class T> T __shfl_up_sync(unsigned, T, int);
template <class T> T __shfl_xor_sync(unsigned, T, int);
void __syncthreads();
void __syncwarp();
[[noreturn]] void __trap();
size_t __cvta_generic_to_shared(const void*);
float __fdiv_rn(float, float);
float __fmul_rn(float, float);
float __fadd_rn(float, float);
unsigned long long atomicAdd(unsigned long long*, unsigned long long);
double atomicAdd(double*, double);
void __threadfence();
unsigned atomicAdd(unsigned*, unsigned);
int atomicAdd(int*, int);
int atomicMin(int*, int);
unsigned long long atomicMax(unsigned long long*, unsigned long long);
