/*
 * A tiny stand-in for the parts of cuda_runtime.h and nccl.h that allreduce_check.cu uses,
 * so its host logic (argument parsing, id exchange through a file, the sweep, the check,
 * the table, error and timeout paths) runs on a machine without a GPU (selftest.sh).
 *
 * "Device" memory is host memory and every stream operation completes at once. The fake
 * all_reduce is real across processes: each rank writes its contribution to a file in a
 * directory named inside the ncclUniqueId (made by rank 0's ncclGetUniqueId), waits for the
 * others' files and sums them, so a wrong id exchange or a wrong reduction shows.
 *
 * With NCCL_DEBUG=INFO it prints the log lines the real NCCL prints for the things the
 * check asserts on (docs/gpu-check.md), so run-gpu-check.sh can be dry-run end to end:
 * it dlopens NCCL_NET_PLUGIN (RTLD_NOW) and reads the `name` of its ncclNetPlugin_v8,
 * picks the network from NCCL_NET like NCCL does (the plugin by name, or the built-in
 * Socket), refuses two ranks with the same NCCL_HOSTID ("Multiple Ranks are using the same
 * GPU"), and logs one send and one receive channel per NCCL_MAX_NCHANNELS (at most 2).
 *
 * Fault injection (environment):
 *   VERBSNET_FAKE_CORRUPT_BYTES=N  rank 1 corrupts one element of the float all_reduce of N bytes
 *   VERBSNET_FAKE_HANG_BYTES=N     the stream never completes after the all_reduce of N bytes
 *   VERBSNET_FAKE_ASYNC_ERROR_BYTES=N  ncclCommGetAsyncError reports ncclRemoteError after it
 *
 * Only for tests; compiled with -DVERBSNET_FAKE_NCCL as C.
 */
#ifndef VERBSNET_FAKE_NCCL_H
#define VERBSNET_FAKE_NCCL_H

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- CUDA runtime ---- */
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotReady = 600
} cudaError_t;

typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
} cudaMemcpyKind;

struct vn_fake_event {
    double t;
};
typedef struct vn_fake_event *cudaEvent_t;
typedef struct vn_fake_stream *cudaStream_t;

static int vn_fake_hung = 0;

static inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    }
    return "unknown error";
}
static inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    (void)k;
    memmove(dst, src, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return cudaSuccess; }
static inline cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = NULL; return cudaSuccess; }
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return cudaSuccess; }
static inline cudaError_t cudaStreamQuery(cudaStream_t s)
{
    (void)s;
    return vn_fake_hung ? cudaErrorNotReady : cudaSuccess;
}
static inline double vn_fake_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t)calloc(1, sizeof(struct vn_fake_event));
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)s;
    e->t = vn_fake_now();
    return cudaSuccess;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)((b->t - a->t) * 1e3);
    if (*ms <= 0.0f) {
        *ms = 1e-3f;
    }
    return cudaSuccess;
}

/* ---- NCCL ---- */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef enum { ncclUint64 = 5, ncclFloat = 7 } ncclDataType_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
struct vn_fake_comm {
    int rank;
    int nranks;
    unsigned long seq;
    char dir[128];
    int async_error;
    int connected;
    char net[64];
};
typedef struct vn_fake_comm *ncclComm_t;

static inline const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclSystemError: return "unhandled system error";
    default: return "fake error";
    }
}
static inline ncclResult_t ncclGetVersion(int *v) { *v = 99999; return ncclSuccess; }
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof(*id));
    const char *base = getenv("TMPDIR");
    snprintf(id->internal, sizeof(id->internal), "%s/vnfake.XXXXXX", base ? base : "/tmp");
    return mkdtemp(id->internal) ? ncclSuccess : ncclSystemError;
}
static inline int vn_fake_debug(void)
{
    const char *d = getenv("NCCL_DEBUG");
    return d != NULL && (strcasecmp(d, "INFO") == 0 || strcasecmp(d, "TRACE") == 0);
}
/* NCCL's line prefix is "host:pid:tid [cudaDev] NCCL INFO ". */
#define VN_FAKE_LOG(level, ...)                                                            \
    do {                                                                                   \
        if (vn_fake_debug() || strcmp(level, "WARN") == 0) {                               \
            printf("fakehost:%ld:%ld [0] NCCL %s ", (long)getpid(), (long)getpid(), level); \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
            fflush(stdout);                                                                \
        }                                                                                  \
    } while (0)

/* Loads NCCL_NET_PLUGIN and picks the network as NCCL does; writes its name to net. */
static inline ncclResult_t vn_fake_pick_net(char *net, size_t len)
{
    const char *plugin = getenv("NCCL_NET_PLUGIN");
    const char *want = getenv("NCCL_NET");
    char plugin_name[64] = "";
    if (getenv("NCCL_HOSTID") != NULL) {
        VN_FAKE_LOG("INFO", "NCCL_HOSTID set by environment to %s", getenv("NCCL_HOSTID"));
    }
    if (plugin != NULL && plugin[0] != '\0' && strcasecmp(plugin, "none") != 0) {
        VN_FAKE_LOG("INFO", "NCCL_NET_PLUGIN set by environment to %s", plugin);
        void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            VN_FAKE_LOG("INFO", "NET/Plugin: Could not find: %s", plugin);
        } else {
            const char *const *sym = (const char *const *)dlsym(h, "ncclNetPlugin_v8");
            if (sym == NULL || *sym == NULL) {
                VN_FAKE_LOG("INFO", "External network plugin %s is unsupported", plugin);
            } else {
                snprintf(plugin_name, sizeof(plugin_name), "%s", *sym);
                VN_FAKE_LOG("INFO", "NET/Plugin: Loaded net plugin %s (v8)", plugin_name);
                VN_FAKE_LOG("INFO", "Successfully loaded external network plugin %s", plugin);
            }
        }
    }
    const char *pick = NULL;
    if (want == NULL || want[0] == '\0') {
        pick = plugin_name[0] ? plugin_name : "Socket";
    } else if (plugin_name[0] && strcasecmp(want, plugin_name) == 0) {
        pick = plugin_name;
    } else if (strcasecmp(want, "Socket") == 0) {
        pick = "Socket";
    }
    if (pick == NULL) {
        VN_FAKE_LOG("WARN", "Failed to initialize any NET plugin");
        return ncclInvalidUsage;
    }
    if (pick == plugin_name) {
        VN_FAKE_LOG("INFO", "Initialized NET plugin %s", pick);
        VN_FAKE_LOG("INFO", "Assigned NET plugin %s to comm", pick);
    }
    VN_FAKE_LOG("INFO", "Using network %s", pick);
    snprintf(net, len, "%s", pick);
    return ncclSuccess;
}

/* Publishes this rank's NCCL_HOSTID and refuses a peer with the same one. */
static inline ncclResult_t vn_fake_check_hosts(ncclComm_t c)
{
    const char *host = getenv("NCCL_HOSTID");
    char mine[256];
    snprintf(mine, sizeof(mine), "%s", host ? host : "fakehost-boot-id");
    char path[256];
    char tmp[300];
    snprintf(path, sizeof(path), "%s/host.%d", c->dir, c->rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fputs(mine, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        return ncclSystemError;
    }
    for (int r = 0; r < c->nranks; r++) {
        char p[256];
        char theirs[256] = "";
        struct stat st;
        snprintf(p, sizeof(p), "%s/host.%d", c->dir, r);
        double deadline = vn_fake_now() + 30.0;
        while (stat(p, &st) != 0) {
            if (vn_fake_now() > deadline) {
                return ncclRemoteError;
            }
            usleep(1000);
        }
        FILE *in = fopen(p, "r");
        if (in == NULL || fgets(theirs, sizeof(theirs), in) == NULL) {
            theirs[0] = '\0';
        }
        if (in != NULL) {
            fclose(in);
        }
        if (r != c->rank && strcmp(theirs, mine) == 0) {
            VN_FAKE_LOG("WARN", "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.");
            return ncclInvalidUsage;
        }
    }
    return ncclSuccess;
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    struct stat st;
    if (id.internal[0] != '/' || stat(id.internal, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "fake ncclCommInitRank: bad unique id\n");
        return ncclInvalidArgument;
    }
    if (rank == 0) {
        VN_FAKE_LOG("INFO", "NCCL version 9.99.0+fake");
    }
    ncclComm_t c = (ncclComm_t)calloc(1, sizeof(*c));
    c->rank = rank;
    c->nranks = nranks;
    memcpy(c->dir, id.internal, sizeof(c->dir));
    ncclResult_t r = vn_fake_pick_net(c->net, sizeof(c->net));
    if (r == ncclSuccess) {
        r = vn_fake_check_hosts(c);
    }
    if (r != ncclSuccess) {
        free(c);
        return r;
    }
    VN_FAKE_LOG("INFO", "ncclCommInitRank comm %p rank %d nranks %d cudaDev 0 nvmlDev 0 busId 0 commId 0x0 - Init COMPLETE", (void *)c, rank, nranks);
    *comm = c;
    return ncclSuccess;
}
static inline int vn_fake_env_is(const char *name, size_t bytes)
{
    const char *v = getenv(name);
    return v != NULL && (size_t)strtoull(v, NULL, 10) == bytes;
}
static inline ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count,
                                         ncclDataType_t type, ncclRedOp_t op, ncclComm_t c,
                                         cudaStream_t s)
{
    (void)s;
    if (op != ncclSum || (type != ncclFloat && type != ncclUint64)) {
        return ncclInvalidArgument;
    }
    if (!c->connected) {
        /* Connections are made at the first collective (NCCL's runtime connect). */
        const char *nch = getenv("NCCL_MAX_NCHANNELS");
        int channels = nch ? atoi(nch) : 2;
        channels = channels < 1 ? 1 : channels > 2 ? 2 : channels;
        int peer = (c->rank + 1) % c->nranks;
        int prev = (c->rank + c->nranks - 1) % c->nranks;
        for (int ch = 0; ch < channels; ch++) {
            VN_FAKE_LOG("INFO", "Channel %02d/0 : %d[0] -> %d[0] [receive] via NET/%s/0", ch, prev, c->rank, c->net);
            VN_FAKE_LOG("INFO", "Channel %02d/0 : %d[0] -> %d[0] [send] via NET/%s/0", ch, c->rank, peer, c->net);
        }
        VN_FAKE_LOG("INFO", "Connected all rings, use ring PXN 0 GDR 0");
        c->connected = 1;
    }
    size_t esz = type == ncclFloat ? 4 : 8;
    size_t bytes = count * esz;
    unsigned long seq = c->seq++;
    char path[256];
    char tmp[300];
    snprintf(path, sizeof(path), "%s/c.%lu.%d", c->dir, seq, c->rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(send, 1, bytes, f) != bytes || fclose(f) != 0 || rename(tmp, path) != 0) {
        return ncclSystemError;
    }
    unsigned char *acc = (unsigned char *)calloc(1, bytes ? bytes : 1);
    unsigned char *part = (unsigned char *)malloc(bytes ? bytes : 1);
    for (int r = 0; r < c->nranks; r++) {
        char p[256];
        snprintf(p, sizeof(p), "%s/c.%lu.%d", c->dir, seq, r);
        double deadline = vn_fake_now() + 30.0;
        struct stat st;
        while (stat(p, &st) != 0 || (size_t)st.st_size != bytes) {
            if (vn_fake_now() > deadline) {
                free(acc);
                free(part);
                return ncclRemoteError;
            }
            usleep(1000);
        }
        FILE *in = fopen(p, "rb");
        if (in == NULL || fread(part, 1, bytes, in) != bytes) {
            free(acc);
            free(part);
            return ncclSystemError;
        }
        fclose(in);
        for (size_t i = 0; i < count; i++) {
            if (type == ncclFloat) {
                ((float *)acc)[i] += ((const float *)part)[i];
            } else {
                ((uint64_t *)acc)[i] += ((const uint64_t *)part)[i];
            }
        }
    }
    memcpy(recv, acc, bytes);
    free(acc);
    free(part);
    /* Everyone has read seq-2 once this rank reached seq (each wrote seq-1 after reading seq-2). */
    if (seq >= 2) {
        snprintf(path, sizeof(path), "%s/c.%lu.%d", c->dir, seq - 2, c->rank);
        unlink(path);
    }
    if (type == ncclFloat && c->rank == 1 && count > 0 && vn_fake_env_is("VERBSNET_FAKE_CORRUPT_BYTES", bytes)) {
        ((float *)recv)[count / 2] += 1.0f;
    }
    if (type == ncclFloat && vn_fake_env_is("VERBSNET_FAKE_HANG_BYTES", bytes)) {
        vn_fake_hung = 1;
    }
    if (type == ncclFloat && vn_fake_env_is("VERBSNET_FAKE_ASYNC_ERROR_BYTES", bytes)) {
        vn_fake_hung = 1;
        c->async_error = 1;
    }
    return ncclSuccess;
}
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    *r = c->async_error ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommAbort(ncclComm_t c) { free(c); return ncclSuccess; }
static inline ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    /* Leftover contribution files are the test's to clean (its temporary directory). */
    free(c);
    return ncclSuccess;
}

#endif /* VERBSNET_FAKE_NCCL_H */
