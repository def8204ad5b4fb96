/*
 * test_alloc_gpu.c — the allocator and the pinned arena on a CUDA device (label gpu): fixed
 * (cudaMalloc) and expandable (VMM) segments under a budget, device contents through the device
 * layer's copies, release-and-retry and OOM, pinned (cudaHostRegister'ed) staging buffers.
 * Skips (77) without a GPU or driver or in a CPU-only build; fails on a GPU that does not work.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "cuda_probe.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

int main(void)
{
    const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
    if (probe != 0)
        return probe;
    struct qc_device *dev = NULL;
    if (qc_device_create(QC_DEVICE_CUDA, 0, &dev) != QC_OK) {
        printf("FATAL: device: %s\n", qc_error_last());
        return 1;
    }
    struct qc_stream *cs = qc_device_compute_stream(dev);
    struct qc_pinned *pin = NULL;
    if (qc_pinned_create(dev, 512 * MiB, &pin) != QC_OK) {
        printf("pinned: %s\n", qc_error_last());
        return 1;
    }

    QC_TEST ("gpu: fixed and expandable segments under a budget, contents round-trip") {
        for (int e = 0; e < 2; e++) {
            struct qc_alloc_params p;
            qc_alloc_params_default(&p);
            p.expandable = e;
            p.budget = 256 * MiB;
            struct qc_alloc *a = NULL;
            T_EXPECT(qc_alloc_create(dev, &p, &a) == QC_OK, "%s", qc_error_last());
            if (!a)
                break;
            uint64_t rng = qc_test_seed();
            void *live[64] = {0};
            size_t size[64] = {0};
            unsigned char *host = NULL;
            T_EXPECT(qc_pinned_malloc(pin, 64 * MiB, 4096, "stage", (void **)&host) == QC_OK, "%s",
                     qc_error_last());
            int ooms = 0;
            for (int op = 0; op < 600 && host; op++) {
                int i = (int)(qc_test_rand(&rng) % 64);
                if (live[i]) {
                    size_t k = size[i] < 4096 ? size[i] : 4096;
                    T_EXPECT(qc_memcpy_async(cs, host, (char *)live[i] + size[i] - k, k,
                                             QC_COPY_D2H) == QC_OK,
                             "d2h");
                    T_EXPECT(qc_stream_synchronize(cs) == QC_OK, "sync");
                    for (size_t j = 0; j < k; j++)
                        if (host[j] != (unsigned char)i)
                            T_FATAL("block %d byte %zu: %u", i, j, host[j]);
                    qc_alloc_free(a, live[i], cs);
                    live[i] = NULL;
                    continue;
                }
                size[i] = 1 + (size_t)(qc_test_rand(&rng) % (40 * MiB));
                enum qc_status st = qc_alloc_malloc(a, size[i], cs, "gpu/t", &live[i]);
                if (st == QC_ERR_NOMEM) {
                    ooms++;
                    T_EXPECT_STR_CONTAINS(qc_error_last(), "requested");
                    live[i] = NULL;
                    continue;
                }
                T_EXPECT(st == QC_OK, "malloc: %s", qc_error_last());
                T_EXPECT(qc_memset_async(cs, live[i], i, size[i]) == QC_OK, "memset");
                T_EXPECT(qc_alloc_check(a) == QC_OK, "%s", qc_error_last());
            }
            for (int i = 0; i < 64; i++)
                qc_alloc_free(a, live[i], cs);
            T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty");
            struct qc_alloc_stats s;
            qc_alloc_stats_get(a, &s);
            T_EXPECT_EQ_U64(s.bytes_reserved, 0, "expandable %d: everything released", e);
            T_EXPECT(s.bytes_reserved_peak <= 256 * MiB, "budget");
            printf("  expandable %d: %d OOMs, %" PRIu64 " retries, fragmentation %.3f\n", e, ooms,
                   s.n_retries, s.fragmentation);
            qc_pinned_free(pin, host);
            qc_alloc_destroy(a);
        }
    }

    qc_pinned_destroy(pin);
    qc_device_destroy(dev);
    return qc_test_summary();
}
