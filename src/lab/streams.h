// Every random stream of the lab and the report, in one registry. A stream is (seed, stream id);
// each tag below names one purpose, and the work items of that purpose add their own fields
// through stream_id({tag, ...}) (lab/common.h), so no two draws share a stream. The values are
// fixed: changing one changes every number drawn from it.
#pragma once

#include <cstdint>

namespace sdpa::lab::streams {

// First field of stream_id({...}).
inline constexpr std::uint64_t kDerive = 0xDE41;          // derive: (tag, distribution, block)
inline constexpr std::uint64_t kSoftmaxSweep = 0x50F7;    // softmax: the 64 normal logits
inline constexpr std::uint64_t kVariance = 0x7A41;        // variance: (tag, row, block)
inline constexpr std::uint64_t kVarianceNonIid = 0x7A42;  // variance_noniid: (tag, case, ...)
inline constexpr std::uint64_t kSaturation = 0x5A7;       // saturation probes (probe.h fields)
inline constexpr std::uint64_t kEntropyCurve = 0xC0E;     // entropy_curve: (tag, N, row)
inline constexpr std::uint64_t kAlternatives = 0xA17;     // alternatives: (tag, sigma, d, ...)
inline constexpr std::uint64_t kTemperature = 0x7E4;      // temperature probes
inline constexpr std::uint64_t kPrecision = 0x9EC;        // precision: (tag, d, tensor, row)
inline constexpr std::uint64_t kTrainStudy = 0x57D;       // train study: (tag, seed index, ...)

// Plain stream ids (no stream_id mixing).
inline constexpr std::uint64_t kTrainInit = 1ULL << 40;   // + d: initial parameters
inline constexpr std::uint64_t kTrainBatch = 2ULL << 40;  // + step: training batch `step`
inline constexpr std::uint64_t kTrainEval = 3ULL << 40;   // the evaluation set
inline constexpr std::uint64_t kAccuracy = 0x5eed0000;    // + 1..4: the report's q, k, v, dO

inline constexpr std::uint64_t kTags[] = {
    kDerive,       kSoftmaxSweep, kVariance,    kVarianceNonIid, kSaturation,
    kEntropyCurve, kAlternatives, kTemperature, kPrecision,      kTrainStudy};

constexpr bool distinct_tags() {
  for (std::uint64_t a : kTags) {
    int same = 0;
    for (std::uint64_t b : kTags) same += a == b;
    if (same != 1) return false;
  }
  return true;
}
static_assert(distinct_tags(), "two purposes share a random-stream tag");

}  // namespace sdpa::lab::streams
