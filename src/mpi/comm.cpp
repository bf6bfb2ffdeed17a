// The MPI layer's common parts: layouts, validation shared by every rank, bounded waits, the
// agreement on errors, gathering shards and the fault-test hook.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "core/variants.h"
#include "io/output.h"
#include "mpi/detail.h"

namespace sdpa::mpi {

const char* strategy_name(Strategy strategy) {
  return strategy == Strategy::ring ? "ring" : "ulysses";
}

Strategy parse_strategy(const std::string& text) {
  if (text == "ring") return Strategy::ring;
  if (text == "ulysses") return Strategy::ulysses;
  throw Error(fmt::format("--context-parallel: expected ring or ulysses, got '{}'", text));
}

std::vector<Range> shard_ranges(std::int64_t length, int ranks, int rank, bool zigzag) {
  const std::int64_t chunks = zigzag ? 2 * std::int64_t(ranks) : ranks;
  auto chunk = [&](std::int64_t c) {
    return Range{c * length / chunks, (c + 1) * length / chunks};
  };
  if (!zigzag) return {chunk(rank)};
  return {chunk(rank), chunk(chunks - 1 - rank)};
}

// The ranks compute plain attention: a variant that depends on absolute positions (window,
// ALiBi), adds a column to every row's softmax (sinks), or draws per element (dropout) would be
// applied per block and come out wrong, so each is refused rather than ignored.
std::string unsupported_variant(const AttentionOptions& a) {
  if (a.window_left >= 0 || a.window_right >= 0) {
    return fmt::format(
        "window_left, window_right: expected -1, -1 (no sliding window) with "
        "context parallelism, got {}, {}",
        a.window_left, a.window_right);
  }
  if (a.softcap != 0.0) {
    return fmt::format("softcap: expected 0 with context parallelism, got {}", a.softcap);
  }
  if (!a.alibi_slopes.empty()) {
    return fmt::format("alibi_slopes: expected none with context parallelism, got {} slopes",
                       a.alibi_slopes.size());
  }
  if (!a.sinks.empty()) {
    return fmt::format("sinks: expected none with context parallelism, got {} sinks",
                       a.sinks.size());
  }
  if (!(a.dropout_p >= 0.0) || sdpa::detail::dropout_threshold(a.dropout_p) > 0) {
    return fmt::format(
        "dropout_p: expected 0 (or below 2^-17, which drops nothing) with "
        "context parallelism, got {}",
        a.dropout_p);
  }
  return "";
}

bool uses_zigzag(Strategy strategy, const AttentionOptions& options) {
  return strategy == Strategy::ring && options.causal != Causal::none;
}

namespace detail {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void* scratch(int slot, std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t(2) << 20;
  struct Slot {
    void* data = nullptr;
    std::size_t size = 0;
    ~Slot() { std::free(data); }
  };
  static Slot slots[16];
  Slot& s = slots[slot];
  if (s.size < bytes || s.data == nullptr) {
    std::free(s.data);
    const std::size_t want = std::max(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    s.data = std::aligned_alloc(kHuge, want);
    if (s.data == nullptr) throw std::bad_alloc();
    madvise(s.data, want, MADV_HUGEPAGE);  // advice only; failure is harmless
    s.size = want;
  }
  return s.data;
}

Around around(const std::vector<std::int64_t>& shape, int axis) {
  Around a;
  for (int i = 0; i < axis; ++i) a.outer *= shape[i];
  a.n = shape[axis];
  for (std::size_t i = axis + 1; i < shape.size(); ++i) a.inner *= shape[i];
  return a;
}

std::vector<std::int64_t> with_dim(std::vector<std::int64_t> shape, int axis, std::int64_t n) {
  shape[axis] = n;
  return shape;
}

Array slice_axis(const TensorRef& t, int axis, std::int64_t lo, std::int64_t hi) {
  const Around a = around(t.shape, axis);
  Array out(t.dtype, with_dim(t.shape, axis, hi - lo));
  const std::size_t row = a.inner * dtype_size(t.dtype);
  const auto* src = static_cast<const unsigned char*>(t.data);
  auto* dst = static_cast<unsigned char*>(out.data());
  for (std::int64_t o = 0; o < a.outer; ++o) {
    std::memcpy(dst + o * (hi - lo) * row, src + (o * a.n + lo) * row, (hi - lo) * row);
  }
  return out;
}

void copy_into(const MutableTensorRef& dst, int axis, std::int64_t lo, const TensorRef& src) {
  const Around d = around(dst.shape, axis), s = around(src.shape, axis);
  const std::size_t row = d.inner * dtype_size(dst.dtype);
  auto* to = static_cast<unsigned char*>(dst.data);
  const auto* from = static_cast<const unsigned char*>(src.data);
  for (std::int64_t o = 0; o < d.outer; ++o) {
    std::memcpy(to + (o * d.n + lo) * row, from + o * s.n * row, s.n * row);
  }
}

template <class T>
void add_typed(const MutableTensorRef& dst, int axis, std::int64_t lo, const TensorRef& src) {
  const Around d = around(dst.shape, axis), s = around(src.shape, axis);
  auto* to = static_cast<T*>(dst.data);
  const auto* from = static_cast<const T*>(src.data);
  for (std::int64_t o = 0; o < d.outer; ++o) {
    T* t = to + (o * d.n + lo) * d.inner;
    const T* f = from + o * s.n * d.inner;
    for (std::int64_t i = 0; i < s.n * d.inner; ++i) t[i] += f[i];
  }
}

void add_into(const MutableTensorRef& dst, int axis, std::int64_t lo, const TensorRef& src) {
  if (dst.dtype == DType::float64) {
    add_typed<double>(dst, axis, lo, src);
  } else {
    add_typed<float>(dst, axis, lo, src);
  }
}

int mpi_count(std::size_t bytes, const char* what) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw Error(fmt::format(
        "{}: expected a message under 2^31 bytes (MPI's count), got {} bytes; use more ranks", what,
        bytes));
  }
  return static_cast<int>(bytes);
}

TensorRef mask_view(const TensorRef& mask) {
  TensorRef m = mask;
  while (m.shape.size() < 2) m.shape.insert(m.shape.begin(), 1);
  return m;
}

std::string check_shape(const char* what, const std::vector<std::int64_t>& got,
                        const std::vector<std::int64_t>& expected) {
  if (got == expected) return "";
  return fmt::format("{}: expected the shard shape {}, got {}", what, shape_string(expected),
                     shape_string(got));
}

namespace {

// What every rank tells the others about its shards, as fixed-size integers.
constexpr int kMaxDims = 8;
constexpr int kDescriptor = 64;

void put_shape(std::vector<std::int64_t>& d, int at, const std::vector<std::int64_t>& shape) {
  d[at] = static_cast<std::int64_t>(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) d[at + 1 + i] = shape[i];
}
std::vector<std::int64_t> get_shape(const std::int64_t* d, int at) {
  return std::vector<std::int64_t>(d + at + 1, d + at + 1 + d[at]);
}

bool broadcastable(const std::vector<std::int64_t>& from, const std::vector<std::int64_t>& to) {
  if (from.size() > to.size()) return false;
  for (std::size_t i = 0; i < from.size(); ++i) {
    const std::int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != 1 && f != t) return false;
  }
  return true;
}

const char* layout_name(bool zigzag) { return zigzag ? "zigzag" : "contiguous"; }

}  // namespace

Layout validate(MPI_Comm comm, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                const TensorRef* mask, const ContextParallelOptions& options,
                const std::string& local_error) {
  Layout lay;
  MPI_Comm_rank(comm, &lay.rank);
  MPI_Comm_size(comm, &lay.ranks);
  lay.timeout = options.timeout_seconds;
  const TensorRef m = mask != nullptr ? mask_view(*mask) : TensorRef{};
  std::string error = local_error;
  auto fail = [&](std::string e) {
    if (error.empty()) error = std::move(e);
  };
  if (options.attention.impl != Impl::fast) {
    fail(
        fmt::format("impl: expected fast with context parallelism (the only implementation "
                    "whose backward takes out and lse as given), got {}",
                    impl_name(options.attention.impl)));
  }
  if (!(options.timeout_seconds > 0)) {
    fail(fmt::format("timeout: expected a positive number of seconds, got {}",
                     options.timeout_seconds));
  }
  if (std::string why = unsupported_variant(options.attention); !why.empty()) fail(why);
  const std::pair<const char*, const TensorRef*> inputs[] = {
      {"query", &q}, {"key", &k}, {"value", &v}, {"mask", mask != nullptr ? &m : nullptr}};
  for (const auto& [name, t] : inputs) {
    if (t == nullptr) continue;
    if (t->shape.size() > kMaxDims || (t != &m && t->shape.size() < 2)) {
      fail(fmt::format("{}: expected 2 to {} dimensions, got shape {}", name, kMaxDims,
                       shape_string(t->shape)));
    }
  }
  if (q.dtype == DType::boolean) fail("query: expected float32 or float64, got bool");
  for (const auto& [name, t] : inputs) {
    if (t != nullptr && (t->dtype == DType::float16 || t->dtype == DType::bfloat16)) {
      fail(fmt::format("{}: expected float32 or float64 with context parallelism, got {}", name,
                       dtype_name(t->dtype)));
    }
  }
  agree(comm, error, options.timeout_seconds);

  std::vector<std::int64_t> mine(kDescriptor, 0);
  mine[0] = static_cast<std::int64_t>(q.dtype);
  mine[1] = static_cast<std::int64_t>(k.dtype) * 16 + static_cast<std::int64_t>(v.dtype);
  mine[2] = static_cast<std::int64_t>(options.attention.causal) * 16 +
            (options.attention.enable_gqa ? 1 : 0);
  mine[3] = static_cast<std::int64_t>(options.strategy);
  if (options.attention.scale) {
    mine[4] = 1;
    std::memcpy(&mine[5], &*options.attention.scale, sizeof(double));
  }
  put_shape(mine, 6, q.shape);
  put_shape(mine, 15, k.shape);
  put_shape(mine, 24, v.shape);
  if (mask != nullptr) {
    mine[33] = 1 + static_cast<std::int64_t>(m.dtype);
    put_shape(mine, 34, m.shape);
  }
  std::vector<std::int64_t> all(kDescriptor * lay.ranks);
  std::vector<MPI_Request> req(1);
  MPI_Iallgather(mine.data(), kDescriptor, MPI_INT64_T, all.data(), kDescriptor, MPI_INT64_T, comm,
                 &req[0]);
  wait_bounded(comm, req, "exchanging shard shapes", options.timeout_seconds);

  // From here on every rank reads the same numbers, so every rank reaches the same verdict.
  const std::int64_t* d0 = all.data();
  auto seq_free = [](std::vector<std::int64_t> s) {
    s[s.size() - 2] = -1;
    return s;
  };
  for (int r = 1; r < lay.ranks; ++r) {
    const std::int64_t* d = all.data() + r * kDescriptor;
    if (!std::equal(d, d + 6, d0) || d[33] != d0[33]) {
      throw Error(fmt::format(
          "rank {}'s dtypes, options or mask presence differ from rank 0's: every rank must "
          "run the same call",
          r));
    }
    const int at[3] = {6, 15, 24};
    const char* names[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; ++i) {
      if (seq_free(get_shape(d, at[i])) != seq_free(get_shape(d0, at[i]))) {
        throw Error(fmt::format(
            "{}: rank {}'s shard has shape {} but rank 0's has {}: shards may differ only in "
            "the sequence dimension (-2)",
            names[i], r, shape_string(get_shape(d, at[i])), shape_string(get_shape(d0, at[i]))));
      }
    }
  }
  lay.dtype = q.dtype;
  lay.zigzag = uses_zigzag(options.strategy, options.attention);
  std::vector<std::int64_t> lq(lay.ranks), lk(lay.ranks), lv(lay.ranks);
  for (int r = 0; r < lay.ranks; ++r) {
    const std::int64_t* d = all.data() + r * kDescriptor;
    lq[r] = get_shape(d, 6)[d[6] - 2];
    lk[r] = get_shape(d, 15)[d[15] - 2];
    lv[r] = get_shape(d, 24)[d[24] - 2];
    lay.L += lq[r];
    lay.S += lk[r];
  }
  for (int r = 0; r < lay.ranks; ++r) {
    lay.q_ranges.push_back(shard_ranges(lay.L, lay.ranks, r, lay.zigzag));
    lay.k_ranges.push_back(shard_ranges(lay.S, lay.ranks, r, lay.zigzag));
    auto total = [](const std::vector<Range>& rs) {
      std::int64_t n = 0;
      for (const Range& x : rs) n += x.size();
      return n;
    };
    const std::int64_t want_q = total(lay.q_ranges[r]), want_k = total(lay.k_ranges[r]);
    auto ranges_text = [](const std::vector<Range>& rs) {
      std::string s;
      for (const Range& x : rs)
        s += fmt::format("{}[{}, {})", s.empty() ? "" : " and ", x.begin, x.end);
      return s;
    };
    if (lq[r] != want_q) {
      throw Error(fmt::format(
          "query: rank {} holds {} rows, but the {} layout of L = {} over {} ranks gives it {} "
          "(global rows {})",
          r, lq[r], layout_name(lay.zigzag), lay.L, lay.ranks, want_q,
          ranges_text(lay.q_ranges[r])));
    }
    if (lk[r] != want_k || lv[r] != want_k) {
      throw Error(fmt::format(
          "key/value: rank {} holds {} key and {} value rows, but the {} layout of S = {} over "
          "{} ranks gives it {} (global rows {})",
          r, lk[r], lv[r], layout_name(lay.zigzag), lay.S, lay.ranks, want_k,
          ranges_text(lay.k_ranges[r])));
    }
  }
  lay.q_shape = with_dim(q.shape, static_cast<int>(q.shape.size()) - 2, lay.L);
  lay.k_shape = with_dim(k.shape, static_cast<int>(k.shape.size()) - 2, lay.S);
  lay.v_shape = with_dim(v.shape, static_cast<int>(v.shape.size()) - 2, lay.S);
  // The global shapes pass the library's own validation (same message as one process).
  static const double dummy = 0;
  const TensorRef gq{&dummy, q.dtype, lay.q_shape}, gk{&dummy, k.dtype, lay.k_shape},
      gv{&dummy, v.dtype, lay.v_shape};
  attention_output_shape(gq, gk, gv, options.attention);
  const std::size_t nd = lay.q_shape.size();
  lay.E = lay.q_shape[nd - 1];
  lay.Ev = lay.v_shape[nd - 1];
  lay.Hq = nd >= 3 ? lay.q_shape[nd - 3] : 1;
  lay.Hkv = nd >= 3 ? lay.k_shape[nd - 3] : 1;
  lay.scale = options.attention.scale.value_or(1.0 / std::sqrt(static_cast<double>(lay.E)));

  if (mask != nullptr) {
    lay.has_mask = true;
    bool rows_sharded = true, rows_broadcast = true;
    std::vector<std::int64_t> global_mask;
    for (int r = 0; r < lay.ranks; ++r) {
      const std::vector<std::int64_t> s = get_shape(all.data() + r * kDescriptor, 34);
      const std::int64_t rows = s[s.size() - 2];
      rows_sharded = rows_sharded && rows == lq[r];
      rows_broadcast = rows_broadcast && rows == 1;
      if (r == 0) global_mask = s;
      if (seq_free(s) != seq_free(global_mask)) {
        throw Error(fmt::format("mask: rank {}'s shard has shape {} but rank 0's has {}", r,
                                shape_string(s), shape_string(global_mask)));
      }
    }
    if (!rows_sharded && !rows_broadcast) {
      throw Error(
          "mask: expected every rank's shard to hold its own query rows (dimension -2 = its "
          "share of L) or one broadcast row, got a mix");
    }
    lay.mask_rows_sharded = rows_sharded && lay.L > 1;
    global_mask[global_mask.size() - 2] = lay.mask_rows_sharded ? lay.L : 1;
    lay.mask_cols_full = global_mask.back() != 1 || lay.S == 1;
    std::vector<std::int64_t> target = lay.q_shape;
    target.back() = lay.S;
    if (!broadcastable(global_mask, target)) {
      throw Error(fmt::format("mask: expected a shape broadcastable to {}, got {}",
                              shape_string(target), shape_string(global_mask)));
    }
  }
  if (options.strategy == Strategy::ulysses && lay.Hkv < lay.ranks) {
    throw Error(fmt::format(
        "--context-parallel ulysses: expected at least as many key/value heads as ranks, got "
        "{} heads for {} ranks; use ring",
        lay.Hkv, lay.ranks));
  }
  return lay;
}

}  // namespace detail

double wait_bounded(MPI_Comm comm, std::vector<MPI_Request>& requests, const std::string& what,
                    double timeout_seconds) {
  const double start = detail::now_seconds();
  int done = 0;
  for (;;) {
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) break;
    const double waited = detail::now_seconds() - start;
    if (waited > timeout_seconds) {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      std::fprintf(stderr,
                   "sdpa: error: rank %d: %s did not complete within %.0f s: another rank failed "
                   "or stalled; aborting every rank\n",
                   rank, what.c_str(), timeout_seconds);
      std::fflush(stderr);
      io::remove_temporaries_now();  // MPI_Abort ends this process without unwinding
      MPI_Abort(comm, 3);
      std::_Exit(3);
    }
    // Each test moves the transfer on (shared-memory transfers advance only inside MPI calls):
    // sleeping between tests, even 50 us, slowed a 1 MB block from ~1 ms to 35 ms here. So
    // yield (an oversubscribed core goes to a rank that computes) and poll again; only a wait
    // longer than a second, a peer that is stalled or much slower, sleeps between polls.
    if (waited < 1.0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return detail::now_seconds() - start;
}

void agree(MPI_Comm comm, const std::string& error, double timeout_seconds) {
  constexpr int kLength = 480;
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  std::vector<char> mine(kLength, '\0'), all(static_cast<std::size_t>(kLength) * ranks);
  std::memcpy(mine.data(), error.data(), std::min<std::size_t>(error.size(), kLength - 1));
  std::vector<MPI_Request> req(1);
  MPI_Iallgather(mine.data(), kLength, MPI_CHAR, all.data(), kLength, MPI_CHAR, comm, &req[0]);
  wait_bounded(comm, req, "agreeing on errors", timeout_seconds);
  for (int r = 0; r < ranks; ++r) {
    const char* e = all.data() + static_cast<std::size_t>(r) * kLength;
    if (e[0] != '\0') throw Error(ranks > 1 ? fmt::format("rank {}: {}", r, e) : std::string(e));
  }
}

void gather_shards(MPI_Comm comm, const TensorRef& shard, int axis,
                   const std::vector<std::vector<Range>>& ranges_of_rank,
                   const MutableTensorRef* full, double timeout_seconds) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const std::size_t elem = dtype_size(shard.dtype);
  const detail::Around a = detail::around(shard.shape, axis);
  const int mine = detail::mpi_count(static_cast<std::size_t>(shard.numel()) * elem, "gather");
  std::vector<int> counts(ranks), displs(ranks);
  std::int64_t total = 0;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t rows = 0;
    for (const Range& x : ranges_of_rank[r]) rows += x.size();
    counts[r] =
        detail::mpi_count(static_cast<std::size_t>(a.outer * rows * a.inner) * elem, "gather");
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  std::vector<unsigned char> buffer(rank == 0 ? static_cast<std::size_t>(total) : 0);
  std::vector<MPI_Request> req(1);
  MPI_Igatherv(shard.data, mine, MPI_BYTE, buffer.data(), counts.data(), displs.data(), MPI_BYTE, 0,
               comm, &req[0]);
  wait_bounded(comm, req, "gathering the results on rank 0", timeout_seconds);
  if (rank != 0 || full == nullptr) return;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t rows = 0;
    for (const Range& x : ranges_of_rank[r]) rows += x.size();
    const TensorRef part{buffer.data() + displs[r], shard.dtype,
                         detail::with_dim(shard.shape, axis, rows)};
    std::int64_t at = 0;
    for (const Range& x : ranges_of_rank[r]) {
      const Array piece = detail::slice_axis(part, axis, at, at + x.size());
      detail::copy_into(*full, axis, x.begin, piece);
      at += x.size();
    }
  }
}

void fault_point(MPI_Comm comm, int step) {
  const char* spec = std::getenv("SDPA_MPI_FAULT");
  if (spec == nullptr) return;
  char action[16] = {0};
  int fault_rank = -1, fault_step = -1;
  if (std::sscanf(spec, "%15[a-z]:%d:%d", action, &fault_rank, &fault_step) != 3) return;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank != fault_rank || step != fault_step) return;
  if (std::strcmp(action, "kill") == 0) std::raise(SIGKILL);
  if (std::strcmp(action, "exit") == 0) std::_Exit(9);
  if (std::strcmp(action, "stall") == 0) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

void context_parallel_forward(MPI_Comm comm, const TensorRef& query, const TensorRef& key,
                              const TensorRef& value, const TensorRef* mask,
                              const ContextParallelOptions& options, const MutableTensorRef& out,
                              const MutableTensorRef& lse, CommStats* stats) {
  std::string local;
  if (query.shape.size() >= 2 && value.shape.size() >= 2) {
    std::vector<std::int64_t> want_out = query.shape;
    want_out.back() = value.shape.back();
    std::vector<std::int64_t> want_lse(query.shape.begin(), query.shape.end() - 1);
    local = detail::check_shape("out", out.shape, want_out);
    if (local.empty()) local = detail::check_shape("lse", lse.shape, want_lse);
    if (local.empty() && (out.dtype != query.dtype || lse.dtype != query.dtype)) {
      local = "out, lse: expected the query's dtype";
    }
  }
  const detail::Layout lay = detail::validate(comm, query, key, value, mask, options, local);
  AttentionOptions o = options.attention;
  o.scale = lay.scale;
  CommStats s;
  const TensorRef m = mask != nullptr ? detail::mask_view(*mask) : TensorRef{};
  if (options.strategy == Strategy::ring) {
    detail::ring_forward(comm, lay, query, key, value, mask ? &m : nullptr, o, out, lse, s);
  } else {
    detail::ulysses_forward(comm, lay, query, key, value, mask ? &m : nullptr, o, out, lse, s);
  }
  if (stats != nullptr) *stats = s;
}

void context_parallel_backward(MPI_Comm comm, const TensorRef& query, const TensorRef& key,
                               const TensorRef& value, const TensorRef* mask, const TensorRef& out,
                               const TensorRef& lse, const TensorRef& grad_out,
                               const ContextParallelOptions& options,
                               const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                               const MutableTensorRef& grad_value, CommStats* stats) {
  std::string local;
  if (query.shape.size() >= 2 && value.shape.size() >= 2) {
    std::vector<std::int64_t> want_out = query.shape;
    want_out.back() = value.shape.back();
    std::vector<std::int64_t> want_lse(query.shape.begin(), query.shape.end() - 1);
    const std::pair<std::string, std::string> checks[] = {
        {"out", detail::check_shape("out", out.shape, want_out)},
        {"lse", detail::check_shape("lse", lse.shape, want_lse)},
        {"grad_out", detail::check_shape("grad_out", grad_out.shape, want_out)},
        {"grad_query", detail::check_shape("grad_query", grad_query.shape, query.shape)},
        {"grad_key", detail::check_shape("grad_key", grad_key.shape, key.shape)},
        {"grad_value", detail::check_shape("grad_value", grad_value.shape, value.shape)}};
    for (const auto& [name, e] : checks) {
      if (local.empty()) local = e;
    }
    for (const TensorRef* t : {&out, &lse, &grad_out}) {
      if (local.empty() && t->dtype != query.dtype) {
        local = "out, lse, grad_out: expected the query's dtype";
      }
    }
    for (const MutableTensorRef* t : {&grad_query, &grad_key, &grad_value}) {
      if (local.empty() && t->dtype != query.dtype) {
        local = "grad_query, grad_key, grad_value: expected the query's dtype";
      }
    }
  }
  const detail::Layout lay = detail::validate(comm, query, key, value, mask, options, local);
  AttentionOptions o = options.attention;
  o.scale = lay.scale;
  CommStats s;
  const TensorRef m = mask != nullptr ? detail::mask_view(*mask) : TensorRef{};
  if (options.strategy == Strategy::ring) {
    detail::ring_backward(comm, lay, query, key, value, mask ? &m : nullptr, out, lse, grad_out, o,
                          grad_query, grad_key, grad_value, s);
  } else {
    detail::ulysses_backward(comm, lay, query, key, value, mask ? &m : nullptr, out, lse, grad_out,
                             o, grad_query, grad_key, grad_value, s);
  }
  if (stats != nullptr) *stats = s;
}

}  // namespace sdpa::mpi
