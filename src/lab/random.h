// Reproducible random numbers for the lab: Philox4x32-10 (Random123), counter-based.
//
// A Stream is identified by (seed, stream id). Its values depend only on those two numbers and
// on how many values were drawn, never on threads or timing: give every parallel work item its
// own stream id (for example the index of a table row, or of a sample block) and the output is
// identical for any thread count.
#pragma once

#include <Random123/philox.h>

#include <cmath>
#include <cstdint>
#include <numbers>

namespace sdpa::lab {

class Stream {
 public:
  Stream(std::uint64_t seed, std::uint64_t stream_id) {
    key_[0] = static_cast<std::uint32_t>(seed);
    key_[1] = static_cast<std::uint32_t>(seed >> 32);
    ctr_[0] = 0;
    ctr_[1] = 0;
    ctr_[2] = static_cast<std::uint32_t>(stream_id);
    ctr_[3] = static_cast<std::uint32_t>(stream_id >> 32);
  }

  /// 32 uniformly random bits.
  std::uint32_t next_u32() {
    if (used_ == 4) refill();
    return block_[used_++];
  }

  /// Uniform in (0, 1): never exactly 0 or 1 (53 random bits, offset by half an ULP).
  double uniform() {
    const std::uint64_t hi = next_u32() >> 5, lo = next_u32() >> 6;  // 27 + 26 bits
    return (static_cast<double>((hi << 26) | lo) + 0.5) * 0x1p-53;
  }

  /// Standard normal, by Box-Muller (both values of a pair are used).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

  /// Uniform integer in [0, n), n >= 1 (rejection sampling: no modulo bias).
  std::uint32_t below(std::uint32_t n) {
    const std::uint32_t limit = static_cast<std::uint32_t>(-n) % n;  // 2^32 mod n
    for (;;) {
      const std::uint32_t x = next_u32();
      if (x >= limit) return x % n;
    }
  }

 private:
  void refill() {
    r123::Philox4x32 gen;
    r123::Philox4x32::ctr_type c = {{ctr_[0], ctr_[1], ctr_[2], ctr_[3]}};
    r123::Philox4x32::key_type k = {{key_[0], key_[1]}};
    const auto out = gen(c, k);
    for (int i = 0; i < 4; ++i) block_[i] = out.v[i];
    used_ = 0;
    if (++ctr_[0] == 0) ++ctr_[1];  // 2^64 blocks per stream
  }

  std::uint32_t key_[2];
  std::uint32_t ctr_[4];
  std::uint32_t block_[4] = {0, 0, 0, 0};
  int used_ = 4;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace sdpa::lab
