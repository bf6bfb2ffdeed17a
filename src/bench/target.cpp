// `sdpa bench --target NAME`: run the kernels and the FMA peak loop on one compiled Highway
// target instead of the best one this CPU supports, so that the code another machine would run
// (AVX2 on a Zen 3, say) can be timed here against a peak measured with the same instructions.
// It uses Highway's own switch (hwy::SetSupportedTargetsForTest, which the kernel tests use to
// pin each target), so every HWY_DYNAMIC_DISPATCH call in the process follows it.
#include <fmt/format.h>

#include <cctype>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "hwy/targets.h"
#include "kernels/gemm_bf16.h"

namespace sdpa::bench {
namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::vector<std::string> selectable_targets() {
  std::vector<std::string> names;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

TargetScope::TargetScope(const std::string& name) {
  if (name.empty()) return;
  std::string known;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (upper(name) == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      active_ = true;
      // vdpbf16ps is chosen by CPUID, outside Highway's dispatch: a target below AVX3_DL is a
      // machine without AVX512_BF16, so bfloat16 takes the converting path there too.
      if (t != HWY_AVX3_DL) detail::bf16::force_fallback_for_test(true);
      return;
    }
    known += (known.empty() ? "" : ", ") + std::string(hwy::TargetName(t));
  }
  throw Error(fmt::format(
      "--target: expected one of the SIMD targets compiled in and supported by this CPU ({}), "
      "got \"{}\"",
      known, name));
}

TargetScope::~TargetScope() {
  if (!active_) return;
  detail::bf16::force_fallback_for_test(false);
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace sdpa::bench
