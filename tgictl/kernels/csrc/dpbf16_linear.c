/* y = x W^T + b for bf16 x of decode-sized row counts (5-32 rows) and bf16 weights as stored, with AVX512-BF16
 * (VDPBF16PS): for CPUs that have it and no AMX (AMD Zen 4 and 5). There torch's bf16 matmul re-lays the
 * weight on every call, so the shard kept a second, oneDNN-blocked copy of every weight for these row counts
 * (kernels/prepacked.py): the weights' bytes twice (SmolLM2 bf16: 258 MiB of a ~1 GiB shard).
 *
 * As csrc/amx_linear.c, the product is computed transposed, y^T = W x^T, so the weight needs no copy: x, a few
 * rows, is interleaved once per call so that one 64-byte vector holds 8 input rows, each in two lanes: the
 * pairs 2q and 2q + 1 of columns (4q, 4q + 1) and (4q + 2, 4q + 3). One 64-bit broadcast of the stored weight
 * row's 4 columns 4q..4q+3 puts its pair 2q in the even lanes and 2q + 1 in the odd ones, so one VDPBF16PS
 * multiplies 8 input rows by 4 columns of one weight row. A strip of NR weight rows keeps NR x V accumulators
 * (V vectors of 8 input rows, NR V <= 24 of the 32 registers, NR <= 12) over all of k: no shuffles, the strip's
 * weights read once per call, the two lanes of a row added at the end. Parallel over strips, round robin, so that
 * each thread prefetches its next strip (contiguous rows) into L2 while it multiplies this one: without that
 * the hardware prefetchers, facing NR streams of 8-byte steps, left it 1.3-3x slower than oneDNN on its copy.
 * Strips of rows that a quantized format decodes first (the `decode` argument) are multiplied the same way.
 *
 * Numerics: every lane sums its own products in the same order (columns ascending) whatever m, V, NR or the
 * thread count, so a row's result does not depend on the other rows of the batch. float32 sums (VDPBF16PS
 * flushes denormal inputs and products to zero), the bias added, rounded to bf16 once: torch's rounding of a
 * bf16 linear, in another order.
 * Layouts: x [m, k] bf16, weight [n, k] bf16, bias [n] float32 or NULL, y [m, n] bf16; k a multiple of 4.
 * Returns 0, or -1 where this build lacks AVX512-BF16, m is outside 1..32, k is not a multiple of 4 or memory
 * is refused (the caller takes another kernel).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "decoded_linear.h"

#if defined(__AVX512BF16__)
#define HAVE_DPBF16_LINEAR 1
#include <immintrin.h>
#endif

#define LANES 16          /* float32 lanes per vector */
#define ROWS_PER_VECTOR 8 /* input rows per vector: each in two lanes, one for even pairs, one for odd */
#define MAX_VECTORS 4     /* up to 32 input rows (at 64, 8 vectors of x per 3 weight rows: slower than oneDNN) */
#define ACCUMULATORS 24   /* NR x V at most: the rest of the 32 registers hold x */
/* NR at most: a strip's rows are that many interleaved streams. With one vector of input rows (5-8 rows), strips
 * of 12 rather than 24 weight rows: SmolLM2's 120 projections, weights from memory, 2 Zen 5 threads, 5 and 8 rows
 * 6.27 / 6.22 -> 5.61 / 5.60 ms (16 and 8 rows per strip: 5.7; at 16 and 32 rows the strips stay 12 and 6). */
#define MAX_STRIP_ROWS 12
#define LINE_QUADS 8      /* 4-column steps per 64-byte line of a weight row */
#define PREFETCH_BYTES 512

int tgictl_dpbf16_linear_available(void) {
#if defined(HAVE_DPBF16_LINEAR)
    return 1;
#else
    return 0;
#endif
}

#if defined(HAVE_DPBF16_LINEAR)
/* out[j][16 v + 2 i + e] = the sum over pairs 2 q + e of weight row j times input row 8 v + i, for NR weight
 * rows (constants where it is inlined). xi: [k / 4][V * 16] pairs, as interleave() lays them. */
static inline __attribute__((always_inline)) void strip(const uint32_t *xi, const uint16_t *w, int64_t k,
                                                        const char *next, int64_t next_bytes, const int V, const int NR,
                                                        float out[ACCUMULATORS][MAX_VECTORS * LANES]) {
    __m512 acc[ACCUMULATORS][MAX_VECTORS];
    for (int j = 0; j < NR; j++)
        for (int v = 0; v < V; v++) acc[j][v] = _mm512_setzero_ps();
    const int64_t quads = k / 4;
    for (int64_t q0 = 0; q0 < quads; q0 += LINE_QUADS) {
        /* Each weight row's line PREFETCH_BYTES ahead: the hardware prefetchers do not follow NR streams of
         * 8-byte steps (without it, 3x slower than oneDNN's contiguous copy with weights streamed from DRAM). */
        for (int j = 0; j < NR; j++) _mm_prefetch((const char *)(w + j * k + 4 * q0) + PREFETCH_BYTES, _MM_HINT_T0);
        /* and NR lines of the thread's next strip (contiguous: rows are adjacent) into L2 */
        for (int64_t line = q0 / LINE_QUADS * NR; line < (q0 / LINE_QUADS + 1) * NR && line * 64 < next_bytes; line++)
            _mm_prefetch(next + line * 64, _MM_HINT_T1);
        const int64_t q_end = q0 + LINE_QUADS < quads ? q0 + LINE_QUADS : quads;
        for (int64_t q = q0; q < q_end; q++) {
            __m512bh xv[MAX_VECTORS];
            for (int v = 0; v < V; v++) xv[v] = (__m512bh)_mm512_loadu_si512(xi + (q * V + v) * LANES);
#pragma GCC unroll 24 /* all NR x V accumulators in registers (GCC would not unroll a strip's rows by itself) */
            for (int j = 0; j < NR; j++) {
                int64_t quad;
                memcpy(&quad, w + j * k + 4 * q, sizeof quad);
                const __m512bh wv = (__m512bh)_mm512_set1_epi64(quad); /* pair 2q in even lanes, 2q + 1 in odd */
                for (int v = 0; v < V; v++) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], xv[v], wv);
            }
        }
    }
    for (int j = 0; j < NR; j++)
        for (int v = 0; v < V; v++) _mm512_storeu_ps(&out[j][v * LANES], acc[j][v]);
}

#define STRIP_CASE(V, NR) \
    case (V) * 32 + (NR): strip(xi, w, k, next, next_bytes, V, NR, out); break;

/* The widest strip for V vectors (NR = min(24 / V, MAX_STRIP_ROWS) weight rows), or one weight row for the tail. */
static void strip_any(const uint32_t *xi, const uint16_t *w, int64_t k, const char *next, int64_t next_bytes, int V,
                      int nr, float out[ACCUMULATORS][MAX_VECTORS * LANES]) {
    switch (V * 32 + nr) {
        STRIP_CASE(1, 12) STRIP_CASE(2, 12) STRIP_CASE(3, 8) STRIP_CASE(4, 6)
        STRIP_CASE(1, 1) STRIP_CASE(2, 1) STRIP_CASE(3, 1) STRIP_CASE(4, 1)
        default: break;
    }
}

/* The first weight row of strip s: full strips of NR rows, then strips of one row. */
static inline int64_t strip_row(int64_t s, int64_t full, int NR) { return s < full ? s * NR : full * NR + (s - full); }

/* x [m, k] -> xi [k / 4][V * 16]: lane 2 i + e of vector v holds row 8 v + i's pair 2 q + e; rows past m zero. */
static void interleave(const uint16_t *x, int64_t m, int64_t k, int V, uint32_t *xi, int64_t q_begin,
                       int64_t q_end) {
    for (int64_t q = q_begin; q < q_end; q++) {
        uint32_t *dst = xi + q * V * LANES;
        for (int64_t i = 0; i < (int64_t)V * ROWS_PER_VECTOR; i++) {
            uint32_t pairs[2] = {0, 0}; /* rows past m multiply as zeros, never written out */
            if (i < m) memcpy(pairs, x + i * k + 4 * q, sizeof pairs);
            dst[2 * i] = pairs[0];
            dst[2 * i + 1] = pairs[1];
        }
    }
}
#endif

int tgictl_dpbf16_decoded_linear(const uint16_t *x, const uint16_t *weight, tgictl_strip_decoder decode,
                                 const void *source, const float *bias, uint16_t *y, int64_t m, int64_t n, int64_t k,
                                 int threads) {
#if defined(HAVE_DPBF16_LINEAR)
    if (k % 4 != 0 || k < 4 || m < 1 || m > MAX_VECTORS * ROWS_PER_VECTOR || n < 1) return -1;
    const int V = (int)((m + ROWS_PER_VECTOR - 1) / ROWS_PER_VECTOR);
    const int NR = ACCUMULATORS / V < MAX_STRIP_ROWS ? ACCUMULATORS / V : MAX_STRIP_ROWS;
    const int64_t quads = k / 4;
    uint32_t *xi = aligned_alloc(64, (size_t)(quads * V * LANES) * sizeof(uint32_t));
    if (xi == NULL) return -1;
    const int64_t full = n / NR, strips = full + n % NR; /* full strips, then one weight row each */
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        const int id = omp_get_thread_num(), count = omp_get_num_threads();
        interleave(x, m, k, V, xi, quads * id / count, quads * (id + 1) / count);
        uint16_t *decoded = NULL;
        float *scratch = NULL;
        if (decode != NULL) {
            decoded = aligned_alloc(64, (size_t)(ACCUMULATORS * k) * sizeof(uint16_t));
            scratch = aligned_alloc(64, (size_t)k * sizeof(float));
            failed = decoded == NULL || scratch == NULL;
        }
#pragma omp barrier
        for (int64_t s = id; s < strips && !failed; s += count) { /* round robin: a thread knows its next strip */
            const int64_t j0 = strip_row(s, full, NR), next = s + count;
            const int nr = s < full ? NR : 1;
            const uint16_t *rows = decoded;
            const char *next_rows = NULL; /* the thread's next strip, to prefetch: stored rows only */
            int64_t next_bytes = 0;
            if (decode != NULL) { /* the decoder reads its blocks in order: the hardware prefetchers follow it */
                decode(source, j0, nr, k, decoded, scratch);
            } else {
                rows = weight + j0 * k;
                if (next < strips) {
                    next_rows = (const char *)(weight + strip_row(next, full, NR) * k);
                    next_bytes = (next < full ? NR : 1) * k * 2;
                }
            }
            float out[ACCUMULATORS][MAX_VECTORS * LANES];
            strip_any(xi, rows, k, next_rows, next_bytes, V, nr, out);
            for (int64_t i = 0; i < m; i++) {
                const int64_t lane = (i / ROWS_PER_VECTOR) * LANES + 2 * (i % ROWS_PER_VECTOR);
                for (int j = 0; j < nr; j++)
                    y[i * n + j0 + j] = float_to_bf16(out[j][lane] + out[j][lane + 1] +
                                                      (bias != NULL ? bias[j0 + j] : 0.0f));
            }
        }
        free(decoded);
        free(scratch);
    }
    free(xi);
    return failed ? -1 : 0;
#else
    (void)x, (void)weight, (void)decode, (void)source, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)threads;
    return -1;
#endif
}

int tgictl_dpbf16_linear_bf16(const uint16_t *x, const uint16_t *weight, const float *bias, uint16_t *y, int64_t m,
                              int64_t n, int64_t k, int threads) {
    return tgictl_dpbf16_decoded_linear(x, weight, NULL, NULL, bias, y, m, n, k, threads);
}
