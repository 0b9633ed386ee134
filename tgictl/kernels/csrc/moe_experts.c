/* An MoE layer's active experts in one call (kernels/moe_experts.py's native_experts; docs/moe.md).
 *
 * At decode batch sizes each active expert multiplies a row or a few: as Python calls that is three kernel calls
 * per expert (gate|up, SiLU·mul, down) with tensor allocation, checks and ctypes conversion around each, ~70 us per
 * expert on 2 AMD EPYC cores with AVX512-BF16 against ~20 us of reading its weights (hidden 512, experts of 256,
 * bf16). This makes the same calls with the same arguments in the same order as Experts.expert_mlp
 * (runtime/shard/layers/moe/experts.py) on the same kernels (linear_desc.h), so its outputs are those of the Python
 * path bit for bit where the Python dispatch takes those kernels (dense bf16 rows always; int4 tiles and int8 rows
 * unless the dispatch table measured torch's kernel faster for that shape, as in csrc/decode_layers.c).
 *
 * x:      [pairs, hidden] bf16, the token rows of every active expert, grouped by expert;
 * spans:  [active, 3] int64 (expert, first row, row after the last) in x;
 * gate_up, down: per expert id its [2 inter, hidden] and [hidden, inter] projections;
 * y:      [pairs, hidden] bf16, each row's expert output (unweighted), in x's order;
 * scratch: workers * tgictl_moe_experts_scratch(max rows of a span, hidden, inter) bytes, 64-byte aligned.
 * With at least two spans per thread, the threads take whole experts (each expert's kernels on one thread: no
 * barrier per expert); with fewer, the experts run one after another, each on every thread. Returns 0, or -2 when a
 * kernel failed (scratch refused inside it): the caller then runs its Python path.
 */
#include <stdint.h>

#include "linear_desc.h"

void tgictl_silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter, int threads);
int omp_get_thread_num(void);

static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t aligned_bytes(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }

/* One worker's bytes: gate|up [m, 2 inter] and the activation [m, inter] in bf16; float32 x and y for the int4 and
 * int8 matrix-vector kernels (linear_desc.h). */
int64_t tgictl_moe_experts_scratch(int64_t max_rows, int64_t hidden, int64_t inter) {
    return aligned_bytes(2 * max_rows * 3 * inter) + aligned_bytes(4 * max_rows * max_i64(hidden, inter)) +
           aligned_bytes(4 * max_rows * max_i64(hidden, 2 * inter));
}

static int expert_mlp(const linear_desc *gate_up, const linear_desc *down, const uint16_t *x, uint16_t *y, int64_t m,
                      int64_t hidden, int64_t inter, char *scratch, int threads) {
    uint16_t *gu = (uint16_t *)scratch, *activated = gu + m * 2 * inter;
    float *x32 = (float *)(scratch + aligned_bytes(2 * m * 3 * inter));
    float *y32 = (float *)((char *)x32 + aligned_bytes(4 * m * max_i64(hidden, inter)));
    if (linear_by_desc(gate_up, x, gu, m, 2 * inter, hidden, NULL, x32, y32, threads) != 0) return -2;
    tgictl_silu_mul_bf16(gu, activated, m, inter, threads);
    return linear_by_desc(down, activated, y, m, hidden, inter, NULL, x32, y32, threads) != 0 ? -2 : 0;
}

int tgictl_moe_experts_bf16(const uint16_t *x, const int64_t *spans, int64_t active, const linear_desc *gate_up,
                            const linear_desc *down, int64_t hidden, int64_t inter, uint16_t *y, void *scratch,
                            int64_t scratch_per_worker, int threads) {
    int status = 0;
    if (active >= 2 * (int64_t)threads && threads > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t i = 0; i < active; i++) {
            const int64_t expert = spans[3 * i], first = spans[3 * i + 1], m = spans[3 * i + 2] - first;
            char *mine = (char *)scratch + omp_get_thread_num() * scratch_per_worker;
            if (expert_mlp(&gate_up[expert], &down[expert], x + first * hidden, y + first * hidden, m, hidden, inter,
                           mine, 1) != 0) {
#pragma omp atomic write
                status = -2;
            }
        }
        return status;
    }
    for (int64_t i = 0; i < active; i++) {
        const int64_t expert = spans[3 * i], first = spans[3 * i + 1], m = spans[3 * i + 2] - first;
        if (expert_mlp(&gate_up[expert], &down[expert], x + first * hidden, y + first * hidden, m, hidden, inter,
                       (char *)scratch, threads) != 0)
            return -2;
    }
    return 0;
}
