/*
 * qc_runtime.h — process-wide runtime defaults that must be in place before the OpenMP runtime
 * starts: the OpenMP wait policy; and SIGXFSZ ignored, so that a write past the file size limit
 * (ulimit -f) is an EFBIG error with the file's name (docs/RELIABILITY.md), not a silent death.
 *
 * Why: libgomp (and the OpenMP build of OpenBLAS, which uses its thread pool) reads
 * OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded, before main(). Its default lets a
 * thread that waits at a barrier spin for up to ~300,000 iterations before sleeping. On a
 * machine whose cores are shared with other work (CI runners, a busy workstation), a spinning
 * thread burns the time slice its partner needs to reach the barrier: a step with 2 threads
 * then took 14.9 s instead of 1.8 s with 1 thread (cpu-smoke, 2 cores, load ≈ 6; passive:
 * 3.3 s; docs/BENCHMARKS.md). With "passive" alone a waiting thread sleeps at once, and waking
 * it costs tens of microseconds per parallel region: on an idle machine the real×4 step at AV2
 * size (thousands of regions) ran 6–7 % slower than with a short spin first. So qctrain sets
 * passive with GOMP_SPINCOUNT=10000 (libgomp spins that many iterations, a few tens of µs, then
 * sleeps): the idle machine gets the quick wake-ups, and a loaded one loses at most that spin
 * per region (docs/BENCHMARKS.md, "The step after the idle profile").
 */
#ifndef QC_BASE_QC_RUNTIME_H
#define QC_BASE_QC_RUNTIME_H

#ifdef __cplusplus
extern "C" {
#endif

/* Ignores SIGXFSZ (always). When OMP_WAIT_POLICY is unset (and GOMP_SPINCOUNT too), sets
 * OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=10000 and re-executes the program (/proc/self/exe with
 * argv) once, so that the OpenMP runtime loads with it. Any value the user set is kept
 * (OMP_WAIT_POLICY=active: spin, for a dedicated machine). Returns only when no re-exec was needed
 * or the exec failed (then the run goes on with the runtime's default). Call first thing in main,
 * before any thread starts. */
void qc_runtime_defaults_apply(char **argv);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_RUNTIME_H */
