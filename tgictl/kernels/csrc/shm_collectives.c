// All-reduce (sum) and all-gather between the tensor-parallel ranks of one host, through a shared
// memory segment (tgictl/runtime/shard/shm_collectives.py maps it). gloo's TCP all-reduce costs two
// network round trips per call, and a decode step makes two per layer; here a call is a copy into this
// rank's slot, one flag store, a wait for the others' flags and a pass over their slots.
//
// Segment layout: a header of one 64-byte line per rank (sequence number, pid), then two parities of
// `world` slots of `slot_bytes` each. Call number `seq` (1, 2, ... in the same order on every rank)
// uses parity seq & 1: a rank writes slot (parity, rank), publishes seq, waits until every rank has
// published seq, then reads every slot of that parity. Rank r can only write parity p again at call
// seq + 2, which it starts after call seq + 1's wait, which every other rank passes only once it has
// finished reading call seq: one barrier per call is enough.
//
// Sums run in float32 over the ranks in rank order, the same order on every rank, so every rank gets
// bit-identical results (the ranks must sample the same tokens from them).
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "bf16.h"

#define LINE 64
#define SPINS_BEFORE_YIELD 4096

typedef struct {
    _Atomic uint64_t seq;
    _Atomic int64_t pid;
    char pad[LINE - 16];
} rank_line;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slot_at(void *base, int world, int64_t slot_bytes, uint64_t seq, int rank) {
    char *data = (char *)base + (int64_t)world * LINE;
    return data + ((int64_t)(seq & 1) * world + rank) * slot_bytes;
}

// Registers this rank's pid so that peers can tell a dead rank from a slow one. Returns 0.
int tgictl_shm_register(void *base, int rank, int64_t pid) {
    rank_line *lines = (rank_line *)base;
    atomic_store_explicit(&lines[rank].pid, pid, memory_order_release);
    return 0;
}

// Publishes `seq` for `rank` and waits for every rank's. 0: all there; -1: timeout; -2: a peer died.
static int barrier(void *base, int rank, int world, uint64_t seq, double timeout_s) {
    rank_line *lines = (rank_line *)base;
    atomic_store_explicit(&lines[rank].seq, seq, memory_order_release);
    double deadline = 0.0;
    for (int r = 0; r < world; r++) {
        long spins = 0;
        while (atomic_load_explicit(&lines[r].seq, memory_order_acquire) < seq) {
            if (++spins < SPINS_BEFORE_YIELD) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            // Slow path: a busy machine, or a peer in trouble. Give the core away and check.
            sched_yield();
            if (deadline == 0.0) deadline = now_s() + timeout_s;
            if ((spins & 255) == 0) {
                int64_t pid = atomic_load_explicit(&lines[r].pid, memory_order_acquire);
                if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) return -2;
                if (now_s() > deadline) return -1;
            }
        }
    }
    return 0;
}

// Sums `n` elements of `data` (dtype 0: float32, 1: bfloat16) over the ranks, in place.
// n * element size must fit `slot_bytes`. Returns 0, or the barrier's error.
int tgictl_shm_all_reduce(void *base, int rank, int world, int64_t slot_bytes, uint64_t seq, void *data,
                          int64_t n, int dtype, double timeout_s) {
    const int64_t size = dtype == 0 ? 4 : 2;
    memcpy(slot_at(base, world, slot_bytes, seq, rank), data, (size_t)(n * size));
    int status = barrier(base, rank, world, seq, timeout_s);
    if (status != 0) return status;
    if (dtype == 0) {
        float *out = (float *)data;
        const float *first = (const float *)slot_at(base, world, slot_bytes, seq, 0);
        for (int64_t i = 0; i < n; i++) out[i] = first[i];
        for (int r = 1; r < world; r++) {
            const float *part = (const float *)slot_at(base, world, slot_bytes, seq, r);
            for (int64_t i = 0; i < n; i++) out[i] += part[i];
        }
    } else {
        uint16_t *out = (uint16_t *)data;
        for (int64_t i = 0; i < n; i++) {
            float sum = 0.0f;
            for (int r = 0; r < world; r++) {
                sum += bf16_to_float(((const uint16_t *)slot_at(base, world, slot_bytes, seq, r))[i]);
            }
            out[i] = float_to_bf16(sum);
        }
    }
    return 0;
}

// Copies every rank's `nbytes` of `data` into `out` ([world][nbytes], rank order).
int tgictl_shm_all_gather(void *base, int rank, int world, int64_t slot_bytes, uint64_t seq, const void *data,
                          int64_t nbytes, void *out, double timeout_s) {
    memcpy(slot_at(base, world, slot_bytes, seq, rank), data, (size_t)nbytes);
    int status = barrier(base, rank, world, seq, timeout_s);
    if (status != 0) return status;
    for (int r = 0; r < world; r++) {
        memcpy((char *)out + (int64_t)r * nbytes, slot_at(base, world, slot_bytes, seq, r), (size_t)nbytes);
    }
    return 0;
}
