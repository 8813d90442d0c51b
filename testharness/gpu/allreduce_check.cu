/*
 * verbsnet stock-NCCL GPU check: one rank of an all_reduce(sum, float) size sweep.
 *
 * Uses only NCCL's public API (nccl.h) and the CUDA runtime. Two (or more) processes are
 * started by run-gpu-check.sh, all on the same GPU, each with its own NCCL_HOSTID so that
 * NCCL treats them as separate hosts and must route every channel through the network
 * plugin. Rank 0 creates the ncclUniqueId and publishes it through a file; the others wait
 * for that file. Each size is filled on the host with a known pattern, reduced, copied back
 * and checked exactly on the host; the per-rank wrong counts are summed with one more
 * all_reduce and rank 0 prints an nccl-tests-style table (see report.c).
 *
 * There are no kernels of our own: the file is C that also compiles as C++ (nvcc) and, with
 * -DVERBSNET_FAKE_NCCL, as plain C against fake_nccl.h, which the CPU-only self test uses.
 *
 * Exit status: 0 all results right, 1 wrong results, 2 usage, 3 CUDA or NCCL call failed,
 * 4 NCCL reported an asynchronous error, 5 a wait timed out.
 */
#ifdef VERBSNET_FAKE_NCCL
#include "fake_nccl.h"
#else
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define VN_EXIT_WRONG 1
#define VN_EXIT_USAGE 2
#define VN_EXIT_CALL 3
#define VN_EXIT_ASYNC 4
#define VN_EXIT_TIMEOUT 5

#define VN_MAX_SIZES 64

static int g_rank = -1;

#define CUDACHECK(call)                                                                    \
    do {                                                                                   \
        cudaError_t vn_e = (call);                                                         \
        if (vn_e != cudaSuccess) {                                                         \
            fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: %s:%d %s: CUDA error %d %s\n", \
                    g_rank, __FILE__, __LINE__, #call, (int)vn_e, cudaGetErrorString(vn_e)); \
            exit(VN_EXIT_CALL);                                                            \
        }                                                                                  \
    } while (0)

#define NCCLCHECK(call)                                                                    \
    do {                                                                                   \
        ncclResult_t vn_r = (call);                                                        \
        if (vn_r != ncclSuccess) {                                                         \
            fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: %s:%d %s: NCCL error %d %s\n", \
                    g_rank, __FILE__, __LINE__, #call, (int)vn_r, ncclGetErrorString(vn_r)); \
            exit(VN_EXIT_CALL);                                                            \
        }                                                                                  \
    } while (0)

struct vn_args {
    int rank;
    int nranks;
    int device;
    const char *id_file;
    const char *table_file;
    size_t min_bytes;
    size_t max_bytes;
    size_t factor;
    size_t iter_budget;
    int warmup;
    int min_iters;
    int max_iters;
    int init_timeout_s;
    int size_timeout_s;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s --rank R --nranks N --id-file PATH [--device D] [--table PATH]\n"
            "       [--min-bytes 8] [--max-bytes 256M] [--factor 2] [--warmup 1]\n"
            "       [--min-iters 2] [--max-iters 20] [--iter-budget 512M]\n"
            "       [--init-timeout 60] [--size-timeout 60]\n",
            argv0);
}

static int parse_int(const char *text, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, struct vn_args *a)
{
    memset(a, 0, sizeof(*a));
    a->rank = -1;
    a->nranks = 0;
    a->min_bytes = 8;
    a->max_bytes = (size_t)256 << 20;
    a->factor = 2;
    a->iter_budget = (size_t)512 << 20;
    a->warmup = 1;
    a->min_iters = 2;
    a->max_iters = 20;
    a->init_timeout_s = 60;
    a->size_timeout_s = 60;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (v == NULL) {
            fprintf(stderr, "option %s needs a value\n", k);
            return -1;
        }
        if (strcmp(k, "--rank") == 0) {
            bad = parse_int(v, 0, 4095, &a->rank);
        } else if (strcmp(k, "--nranks") == 0) {
            bad = parse_int(v, 1, 4096, &a->nranks);
        } else if (strcmp(k, "--device") == 0) {
            bad = parse_int(v, 0, 1023, &a->device);
        } else if (strcmp(k, "--id-file") == 0) {
            a->id_file = v;
        } else if (strcmp(k, "--table") == 0) {
            a->table_file = v;
        } else if (strcmp(k, "--min-bytes") == 0) {
            bad = vn_parse_bytes(v, &a->min_bytes);
        } else if (strcmp(k, "--max-bytes") == 0) {
            bad = vn_parse_bytes(v, &a->max_bytes);
        } else if (strcmp(k, "--factor") == 0) {
            bad = vn_parse_bytes(v, &a->factor);
        } else if (strcmp(k, "--iter-budget") == 0) {
            bad = vn_parse_bytes(v, &a->iter_budget);
        } else if (strcmp(k, "--warmup") == 0) {
            bad = parse_int(v, 0, 1000, &a->warmup);
        } else if (strcmp(k, "--min-iters") == 0) {
            bad = parse_int(v, 1, 100000, &a->min_iters);
        } else if (strcmp(k, "--max-iters") == 0) {
            bad = parse_int(v, 1, 100000, &a->max_iters);
        } else if (strcmp(k, "--init-timeout") == 0) {
            bad = parse_int(v, 1, 86400, &a->init_timeout_s);
        } else if (strcmp(k, "--size-timeout") == 0) {
            bad = parse_int(v, 1, 86400, &a->size_timeout_s);
        } else {
            fprintf(stderr, "unknown option %s\n", k);
            return -1;
        }
        if (bad != 0) {
            fprintf(stderr, "bad value for %s: %s\n", k, v);
            return -1;
        }
        i++;
    }
    if (a->rank < 0 || a->nranks < 1 || a->rank >= a->nranks || a->id_file == NULL) {
        fprintf(stderr, "--rank, --nranks (rank < nranks) and --id-file are required\n");
        return -1;
    }
    if (a->min_bytes < sizeof(float) || a->max_bytes < a->min_bytes || a->factor < 2) {
        fprintf(stderr, "need 4 <= --min-bytes <= --max-bytes and --factor >= 2\n");
        return -1;
    }
    return 0;
}

/* Rank 0: publish the id atomically (write a private file, then rename it into place). */
static void write_id_file(const char *path, const ncclUniqueId *id)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) {
        fprintf(stderr, "# verbsnet-gpu-check rank 0 FAILED: create %s: %s\n", tmp, strerror(errno));
        exit(VN_EXIT_CALL);
    }
    const char *p = (const char *)id;
    size_t left = sizeof(*id);
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            fprintf(stderr, "# verbsnet-gpu-check rank 0 FAILED: write %s: %s\n", tmp, strerror(errno));
            exit(VN_EXIT_CALL);
        }
        p += n;
        left -= (size_t)n;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "# verbsnet-gpu-check rank 0 FAILED: publish %s: %s\n", path, strerror(errno));
        exit(VN_EXIT_CALL);
    }
}

/* Other ranks: wait for the file to appear with the full id in it. */
static void read_id_file(const char *path, ncclUniqueId *id, int timeout_s)
{
    double deadline = now_s() + timeout_s;
    for (;;) {
        struct stat st;
        if (stat(path, &st) == 0 && (size_t)st.st_size == sizeof(*id)) {
            break;
        }
        if (now_s() > deadline) {
            fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: no ncclUniqueId in %s after %d s "
                    "(did rank 0 start?)\n", g_rank, path, timeout_s);
            exit(VN_EXIT_TIMEOUT);
        }
        usleep(10000);
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL || fread(id, sizeof(*id), 1, f) != 1) {
        fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: read %s: %s\n", g_rank, path,
                strerror(errno));
        exit(VN_EXIT_CALL);
    }
    fclose(f);
}

/* Waits for the stream without blocking in the driver, so an NCCL error or a hang is
 * reported with the size it happened at instead of leaving the process stuck. */
static void wait_stream(cudaStream_t s, ncclComm_t comm, double deadline, const char *what,
                        size_t bytes)
{
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) {
            return;
        }
        if (e != cudaErrorNotReady) {
            fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: %s of %zu bytes: CUDA error %d %s\n",
                    g_rank, what, bytes, (int)e, cudaGetErrorString(e));
            exit(VN_EXIT_CALL);
        }
        ncclResult_t async_err = ncclSuccess;
        NCCLCHECK(ncclCommGetAsyncError(comm, &async_err));
        if (async_err != ncclSuccess && async_err != ncclInProgress) {
            fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: %s of %zu bytes: NCCL async error "
                    "%d %s\n", g_rank, what, bytes, (int)async_err, ncclGetErrorString(async_err));
            fflush(stderr);
            ncclCommAbort(comm);
            exit(VN_EXIT_ASYNC);
        }
        if (now_s() > deadline) {
            fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: %s of %zu bytes did not complete "
                    "in time (hang?)\n", g_rank, what, bytes);
            fflush(stderr);
            ncclCommAbort(comm);
            exit(VN_EXIT_TIMEOUT);
        }
        usleep(50);
    }
}

int main(int argc, char **argv)
{
    struct vn_args a;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_args(argc, argv, &a) != 0) {
        usage(argv[0]);
        return VN_EXIT_USAGE;
    }
    g_rank = a.rank;

    size_t sizes[VN_MAX_SIZES];
    size_t nsizes = vn_size_sweep(a.min_bytes, a.max_bytes, a.factor, sizeof(float), sizes,
                                  VN_MAX_SIZES);
    if (nsizes == 0) {
        fprintf(stderr, "empty size sweep\n");
        return VN_EXIT_USAGE;
    }
    size_t max_bytes = sizes[nsizes - 1];

    int version = 0;
    NCCLCHECK(ncclGetVersion(&version));
    int ndev = 0;
    CUDACHECK(cudaGetDeviceCount(&ndev));
    printf("# verbsnet-gpu-check rank %d/%d pid %ld cuda device %d of %d, NCCL version code %d, "
           "%zu sizes %zu..%zu B\n", a.rank, a.nranks, (long)getpid(), a.device, ndev, version,
           nsizes, sizes[0], max_bytes);
    CUDACHECK(cudaSetDevice(a.device));

    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (a.rank == 0) {
        NCCLCHECK(ncclGetUniqueId(&id));
        write_id_file(a.id_file, &id);
    } else {
        read_id_file(a.id_file, &id, a.init_timeout_s);
    }

    cudaStream_t stream;
    CUDACHECK(cudaStreamCreate(&stream));
    ncclComm_t comm;
    double t0 = now_s();
    NCCLCHECK(ncclCommInitRank(&comm, a.nranks, id, a.rank));
    printf("# verbsnet-gpu-check rank %d ncclCommInitRank done in %.2f s\n", a.rank, now_s() - t0);

    float *d_send = NULL;
    float *d_recv = NULL;
    uint64_t *d_wrong = NULL;
    CUDACHECK(cudaMalloc((void **)&d_send, max_bytes));
    CUDACHECK(cudaMalloc((void **)&d_recv, max_bytes));
    CUDACHECK(cudaMalloc((void **)&d_wrong, sizeof(uint64_t)));
    float *h_buf = (float *)malloc(max_bytes);
    if (h_buf == NULL) {
        fprintf(stderr, "# verbsnet-gpu-check rank %d FAILED: malloc %zu\n", a.rank, max_bytes);
        return VN_EXIT_CALL;
    }
    cudaEvent_t ev_start;
    cudaEvent_t ev_stop;
    CUDACHECK(cudaEventCreate(&ev_start));
    CUDACHECK(cudaEventCreate(&ev_stop));

    FILE *table = NULL;
    if (a.rank == 0 && a.table_file != NULL) {
        table = fopen(a.table_file, "w");
        if (table == NULL) {
            fprintf(stderr, "# verbsnet-gpu-check rank 0 FAILED: open %s: %s\n", a.table_file,
                    strerror(errno));
            return VN_EXIT_CALL;
        }
    }
    if (a.rank == 0) {
        printf("# all_reduce sum float, %d ranks, out-of-place, checked on the host\n", a.nranks);
        vn_table_header(stdout);
        if (table != NULL) {
            vn_table_header(table);
        }
    }

    uint64_t total_wrong = 0;
    uint64_t local_wrong_total = 0;
    double busbw_sum = 0.0;
    for (size_t k = 0; k < nsizes; k++) {
        size_t bytes = sizes[k];
        size_t count = bytes / sizeof(float);
        unsigned seed = (unsigned)(k + 1);
        int iters = vn_iters_for_size(bytes, a.iter_budget, a.min_iters, a.max_iters);
        double deadline = now_s() + a.size_timeout_s;

        vn_fill(h_buf, count, a.rank, seed);
        CUDACHECK(cudaMemcpy(d_send, h_buf, bytes, cudaMemcpyHostToDevice));
        /* All-ones bytes are NaN floats: a result NCCL never wrote cannot pass the check. */
        CUDACHECK(cudaMemset(d_recv, 0xff, bytes));
        CUDACHECK(cudaDeviceSynchronize());

        for (int w = 0; w < a.warmup; w++) {
            NCCLCHECK(ncclAllReduce(d_send, d_recv, count, ncclFloat, ncclSum, comm, stream));
        }
        wait_stream(stream, comm, deadline, "warm-up all_reduce", bytes);

        CUDACHECK(cudaEventRecord(ev_start, stream));
        for (int it = 0; it < iters; it++) {
            NCCLCHECK(ncclAllReduce(d_send, d_recv, count, ncclFloat, ncclSum, comm, stream));
        }
        CUDACHECK(cudaEventRecord(ev_stop, stream));
        wait_stream(stream, comm, deadline, "timed all_reduce", bytes);
        float ms = 0.0f;
        CUDACHECK(cudaEventElapsedTime(&ms, ev_start, ev_stop));
        double time_us = (double)ms * 1000.0 / (double)iters;

        CUDACHECK(cudaMemcpy(h_buf, d_recv, bytes, cudaMemcpyDeviceToHost));
        size_t first_bad = count;
        uint64_t wrong = vn_count_wrong(h_buf, count, a.nranks, seed, &first_bad);
        if (wrong != 0) {
            fprintf(stderr, "# verbsnet-gpu-check rank %d: %llu of %zu elements wrong at %zu bytes; "
                    "first at [%zu]: got %g want %g\n", a.rank, (unsigned long long)wrong, count,
                    bytes, first_bad, (double)h_buf[first_bad],
                    (double)vn_expected_sum(a.nranks, first_bad, seed));
        }
        local_wrong_total += wrong;

        /* Sum the wrong counts over ranks (through NCCL too), as nccl-tests reports them. */
        CUDACHECK(cudaMemcpy(d_wrong, &wrong, sizeof(wrong), cudaMemcpyHostToDevice));
        NCCLCHECK(ncclAllReduce(d_wrong, d_wrong, 1, ncclUint64, ncclSum, comm, stream));
        wait_stream(stream, comm, now_s() + a.size_timeout_s, "wrong-count all_reduce", bytes);
        uint64_t global_wrong = 0;
        CUDACHECK(cudaMemcpy(&global_wrong, d_wrong, sizeof(global_wrong), cudaMemcpyDeviceToHost));
        if (global_wrong < wrong) {
            global_wrong = wrong; /* the count itself came back wrong: never hide our own */
        }
        total_wrong += global_wrong;
        busbw_sum += vn_allreduce_busbw_gbs(bytes, time_us, a.nranks);
        if (a.rank == 0) {
            vn_table_row(stdout, bytes, sizeof(float), "float", "sum", time_us, a.nranks,
                         global_wrong);
            if (table != NULL) {
                vn_table_row(table, bytes, sizeof(float), "float", "sum", time_us, a.nranks,
                             global_wrong);
            }
        }
    }

    if (a.rank == 0) {
        vn_table_footer(stdout, total_wrong, busbw_sum, nsizes);
        if (table != NULL) {
            vn_table_footer(table, total_wrong, busbw_sum, nsizes);
            fclose(table);
        }
    }

    CUDACHECK(cudaEventDestroy(ev_start));
    CUDACHECK(cudaEventDestroy(ev_stop));
    CUDACHECK(cudaFree(d_send));
    CUDACHECK(cudaFree(d_recv));
    CUDACHECK(cudaFree(d_wrong));
    free(h_buf);
    NCCLCHECK(ncclCommDestroy(comm));
    CUDACHECK(cudaStreamDestroy(stream));
    printf("# verbsnet-gpu-check rank %d done: local wrong %llu, all ranks wrong %llu: %s\n",
           a.rank, (unsigned long long)local_wrong_total, (unsigned long long)total_wrong,
           total_wrong == 0 && local_wrong_total == 0 ? "OK" : "FAILED");
    return total_wrong == 0 && local_wrong_total == 0 ? 0 : VN_EXIT_WRONG;
}
