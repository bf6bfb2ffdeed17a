// ggml's CPU flash attention (ggml_flash_attn_ext) on one decode step, for
// bench/decode_vs_ggml.sh: q (one token, Hq heads, float32) against a K/V cache laid out as
// llama.cpp lays out its own (position-major, S x Hkv x E in memory) and viewed as [E, S, Hkv],
// float32 or float16. The context's memory is on transparent huge pages, like the caches of
// `sdpa bench --kv-cache` and the array of its streaming-read probe. Prints one JSON line:
// median wall and CPU seconds of REPEAT calls after one warm-up, and K/V bytes per second.
// Note that ggml's worker threads spin while they wait, so its CPU time counts the waits too.
// usage: ggml_fa_decode HQ HKV S E f32|f16 THREADS REPEAT
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return x < y ? -1 : x > y; }

int main(int argc, char** argv) {
  if (argc < 8) { fprintf(stderr, "usage: %s HQ HKV S E f32|f16 THREADS REPEAT\n", argv[0]); return 2; }
  const int64_t Hq = atoll(argv[1]), Hkv = atoll(argv[2]), S = atoll(argv[3]), E = atoll(argv[4]);
  const enum ggml_type type = strcmp(argv[5], "f16") == 0 ? GGML_TYPE_F16 : GGML_TYPE_F32;
  const int threads = atoi(argv[6]), repeat = atoi(argv[7]);
  const size_t es = ggml_type_size(type);
  const size_t kv = (size_t)(S * Hkv * E) * es;
  const size_t huge = (size_t)2 << 20;
  const size_t mem = (2 * kv + ((size_t)256 << 20) + huge - 1) / huge * huge;
  void* buffer = aligned_alloc(huge, mem);
  if (buffer == NULL) { fprintf(stderr, "out of memory\n"); return 1; }
  madvise(buffer, mem, MADV_HUGEPAGE);
  struct ggml_init_params ip = {mem, buffer, false};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, E, 1, Hq, 1);
  struct ggml_tensor* kc = ggml_new_tensor_3d(ctx, type, E, Hkv, S);  // cache rows: all heads of a position
  struct ggml_tensor* vc = ggml_new_tensor_3d(ctx, type, E, Hkv, S);
  uint64_t x = 88172645463325252ull;
  float* row = malloc(sizeof(float) * (size_t)(Hkv * E));
  for (int t = 0; t < 2; ++t) {
    struct ggml_tensor* c = t == 0 ? kc : vc;
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t i = 0; i < Hkv * E; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        row[i] = (float)((x >> 40) * (2.0 / 16777216.0) - 1.0);
      }
      char* dst = (char*)c->data + (size_t)s * c->nb[2];
      if (type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(row, (ggml_fp16_t*)dst, Hkv * E);
      else memcpy(dst, row, sizeof(float) * (size_t)(Hkv * E));
    }
  }
  for (int64_t i = 0; i < Hq * E; ++i) ((float*)q->data)[i] = (float)((i * 7919 % 1000) / 500.0 - 1.0);
  // [E, S, Hkv] views: row stride nb[2] of the cache (one position), head stride nb[1].
  struct ggml_tensor* k = ggml_view_3d(ctx, kc, E, S, Hkv, kc->nb[2], kc->nb[1], 0);
  struct ggml_tensor* v = ggml_view_3d(ctx, vc, E, S, Hkv, vc->nb[2], vc->nb[1], 0);
  struct ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, NULL, 1.0f / sqrtf((float)E), 0.0f, 0.0f);
  ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
  struct ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, out);
  ggml_graph_compute_with_ctx(ctx, gf, threads);  // warm-up
  double* wall = malloc(sizeof(double) * repeat), *cpu = malloc(sizeof(double) * repeat);
  for (int r = 0; r < repeat; ++r) {
    const double c0 = now(CLOCK_PROCESS_CPUTIME_ID), t0 = now(CLOCK_MONOTONIC);
    ggml_graph_compute_with_ctx(ctx, gf, threads);
    wall[r] = now(CLOCK_MONOTONIC) - t0;
    cpu[r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
  }
  qsort(wall, repeat, sizeof(double), cmp);
  qsort(cpu, repeat, sizeof(double), cmp);
  double check = 0;
  for (int64_t i = 0; i < Hq * E; ++i) check += ((float*)out->data)[i];
  const double bytes = 2.0 * (double)kv;
  printf("{\"impl\": \"ggml\", \"kv_type\": \"%s\", \"heads\": %lld, \"kv_heads\": %lld, \"kv_seq\": %lld, \"dim\": %lld, "
         "\"threads\": %d, \"repeat\": %d, \"seconds_median\": %.6f, \"seconds_min\": %.6f, \"cpu_seconds_median\": %.6f, "
         "\"kv_bytes\": %.0f, \"kv_gbps_median\": %.3f, \"kv_gbps_per_cpu_second\": %.3f, \"check\": %.6f}\n",
         argv[5], (long long)Hq, (long long)Hkv, (long long)S, (long long)E, threads, repeat, wall[repeat / 2], wall[0],
         cpu[repeat / 2], bytes, bytes / wall[repeat / 2] * 1e-9, bytes / cpu[repeat / 2] * 1e-9, check);
  ggml_free(ctx);
  free(buffer);
  free(row);
  free(wall);
  free(cpu);
  return 0;
}
