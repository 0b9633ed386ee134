/* The k largest values of each float32 row, sorted descending: torch.topk(x, k).values for the sampler's
 * top_k and top_p (runtime/shard/sampling/logits_processors.py), which read the values only.
 *
 * Why: torch.topk over SmolLM2's 49,152-entry rows took ~55 us for one row and 0.6-1.9 ms for 32 (k 64-256,
 * 2 AMD Zen 5 cores), most of a sampled step's warpers. Here one pass per row keeps a min-heap of the k best
 * values seen; a block of 64 values whose maximum does not beat the heap's smallest (nearly every block once
 * the heap holds real candidates) costs one vectorised maximum, so a row is a few microseconds. The values are
 * torch's exactly (the same multiset of floats, sorted); which of equal entries was kept cannot show.
 *
 * Layouts: x [rows, cols] float32, out [rows, k] float32; 1 <= k <= cols. Returns the number of rows holding
 * a NaN (torch orders NaN above everything): their output is unset and the caller takes torch for the call.
 */
#include <math.h>
#include <stdint.h>

#define BLOCK 64
#define PARALLEL_MIN_ROWS 2

static inline void sift_down(float *heap, int64_t k, int64_t at) {
    for (;;) {
        const int64_t left = 2 * at + 1, right = left + 1;
        int64_t smallest = at;
        if (left < k && heap[left] < heap[smallest]) smallest = left;
        if (right < k && heap[right] < heap[smallest]) smallest = right;
        if (smallest == at) return;
        const float t = heap[at];
        heap[at] = heap[smallest];
        heap[smallest] = t;
        at = smallest;
    }
}

/* The row's k best into out (a min-heap while scanning, then sorted descending in place); 1 if it has a NaN. */
static int row_topk(const float *x, int64_t cols, int64_t k, float *out) {
    for (int64_t j = 0; j < k; j++) {
        if (x[j] != x[j]) return 1;
        out[j] = x[j];
    }
    for (int64_t j = k / 2 - 1; j >= 0; j--) sift_down(out, k, j);
    for (int64_t b = k; b < cols; b += BLOCK) {
        const int64_t end = b + BLOCK < cols ? b + BLOCK : cols;
        float best = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
        for (int64_t j = b; j < end; j++) {
            nan |= x[j] != x[j];
            best = x[j] > best ? x[j] : best;
        }
        if (nan) return 1;
        if (!(best > out[0])) continue;
        for (int64_t j = b; j < end; j++)
            if (x[j] > out[0]) {
                out[0] = x[j];
                sift_down(out, k, 0);
            }
    }
    for (int64_t n = k - 1; n > 0; n--) { /* heap sort: the smallest to the back, so the front ends descending */
        const float t = out[0];
        out[0] = out[n];
        out[n] = t;
        sift_down(out, n, 0);
    }
    return 0;
}

int64_t tgictl_topk_values_f32(const float *x, int64_t rows, int64_t cols, int64_t k, float *out, int threads) {
    int64_t with_nan = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : with_nan) if (rows >= PARALLEL_MIN_ROWS)
    for (int64_t r = 0; r < rows; r++) with_nan += row_topk(x + r * cols, cols, k, out + r * k);
    return with_nan;
}
