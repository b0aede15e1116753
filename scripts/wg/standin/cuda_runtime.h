#pragma once
#include "cuda_standin.h"
enum cudaError_t { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
struct cudaDeviceProp { char name[256]; int major, minor, multiProcessorCount, l2CacheSize; size_t sharedMemPerBlockOptin; };
struct cudaFuncAttributes { int numRegs; size_t localSizeBytes; };
typedef struct CUevent_st* cudaEvent_t;
const char* cudaGetErrorString(cudaError_t);
cudaError_t cudaGetLastError();
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetDeviceProperties(cudaDeviceProp*, int);
template <class T> cudaError_t cudaMalloc(T**, size_t);
cudaError_t cudaFree(void*);
cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind);
cudaError_t cudaMemset(void*, int, size_t);
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int);
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes*, const void*);
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int*, const void*, int, size_t);
// The C++ API's overloads for kernel function pointers.
template <class T> cudaError_t cudaFuncSetAttribute(T*, cudaFuncAttribute, int);
template <class T> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes*, T*);
template <class T> cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int*, T*, int, size_t);
cudaError_t cudaEventCreate(cudaEvent_t*);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaEventRecord(cudaEvent_t, int = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaEventElapsedTime(float*, cudaEvent_t, cudaEvent_t);
