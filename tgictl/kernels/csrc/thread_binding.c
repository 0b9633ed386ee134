/* Binding the OpenMP team of the calling thread to one CPU each (runtime/shard/cpu_threads.py says why).
 *
 * One parallel region of `count` threads: thread i pins itself to cpus[i] with sched_setaffinity (pid 0 is the
 * calling thread on Linux). libgomp reuses the same pool threads, in the same order, for every later team of
 * this master (torch's parallel regions and the other kernels of this library, which share libgomp.so.1), so
 * the binding outlives the region. The master (thread 0) is the thread that calls this: the shard's device
 * thread. Returns the number of threads that could not be bound (0 on success); -1 when the team came out
 * smaller than `count` (OMP_DYNAMIC or a thread limit), and then nothing is bound. */
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>

int tgictl_bind_omp_threads(const int *cpus, int count) {
    int failed = 0, short_team = 0;
#pragma omp parallel num_threads(count) reduction(+ : failed) reduction(| : short_team)
    {
        if (omp_get_num_threads() != count) {
            short_team = 1;
        } else {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpus[omp_get_thread_num()], &set);
            failed += sched_setaffinity(0, sizeof(set), &set) != 0;
        }
    }
    return short_team ? -1 : failed;
}
