// The CPU's vendor, for the kernels' choices that depend on a microarchitecture rather than on
// an instruction set (bf16::dot_pairs_in_kernel, flash::backward_memory).
#pragma once

namespace sdpa::detail {

enum class CpuVendor { amd, intel, other };

/// Read once from CPUID (GCC's builtins); `other` off x86.
inline CpuVendor cpu_vendor() {
#if defined(__x86_64__) || defined(__i386__)
  static const CpuVendor vendor = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd") != 0) return CpuVendor::amd;
    if (__builtin_cpu_is("intel") != 0) return CpuVendor::intel;
    return CpuVendor::other;
  }();
  return vendor;
#else
  return CpuVendor::other;
#endif
}

}  // namespace sdpa::detail
