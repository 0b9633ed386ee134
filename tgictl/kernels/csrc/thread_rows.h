/* The matrix-vector kernels' split of output rows between OpenMP threads (small_linear.c, int8_linear.c): one
 * contiguous range per thread, in whole tiles but the last thread's, so that each thread's weight reads are
 * one stream its prefetches run ahead in. Call inside the parallel region. */
#ifndef TGICTL_THREAD_ROWS_H
#define TGICTL_THREAD_ROWS_H

#include <stdint.h>

#include <omp.h>

static inline void thread_rows(int64_t n, int64_t tile, int64_t *lo, int64_t *hi) {
    const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num(), tiles = n / tile;
    *lo = tiles * part / parts * tile;
    *hi = part == parts - 1 ? n : tiles * (part + 1) / parts * tile;
}

#endif
