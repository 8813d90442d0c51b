/*
 * verbsnet's own description of the NCCL network-plugin ABI, versions 7 to 12, one section per
 * version (v8 first, it is the base the others are described against).
 *
 * Written for this project from the ABI's facts (field order, sizes and constants measured on
 * x86_64 / LP64; docs/nccl-abi.md, "Layouts"). It is not a copy of any NCCL header: names
 * follow NCCL's spelling only where the ABI makes the name part of the contract (the exported
 * symbols ncclNetPlugin_v7 ... ncclNetPlugin_v12) or where users search for it in logs and
 * docs.
 *
 * Every size and offset is asserted at compile time in plugin/ffi/abi.rs, with the source of
 * each number (NCCL's src/include/plugin/net/net_v<N>.h, read at NVIDIA/nccl 5067397, and the
 * sizes g++ gives those headers on x86_64, listed in docs/nccl-abi.md).
 *
 * Adding a version: one new section here (its properties, table and any new struct), one
 * adapter file plugin/ffi/v<N>.rs, and its symbol in plugin/ffi/exports.map.
 */
#ifndef VERBSNET_NET_H
#define VERBSNET_NET_H

#include <stddef.h>
#include <stdint.h>

/* Result codes returned by every plugin entry point (an int-sized enum). */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,   /* network or hardware failure on this host */
  ncclInternalError = 3, /* a bug, or NCCL misusing the plugin */
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,  /* user misconfiguration (e.g. send larger than receive) */
  ncclRemoteError = 6,   /* the peer or the path to it failed */
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* Log levels understood by NCCL's logger callback. */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem bits; a line prints only if its bits meet NCCL_DEBUG_SUBSYS. */
typedef enum {
  NCCL_INIT = 0x1,
  NCCL_COLL = 0x2,
  NCCL_P2P = 0x4,
  NCCL_SHM = 0x8,
  NCCL_NET = 0x10,
  NCCL_GRAPH = 0x20,
  NCCL_TUNING = 0x40,
  NCCL_ENV = 0x80,
  NCCL_ALLOC = 0x100,
  NCCL_CALL = 0x200,
  NCCL_PROXY = 0x400,
  NCCL_ALL = ~0
} ncclDebugLogSubSys;

/* printf-style, variadic: always call it with fmt = "%s". */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char *file, int line, const char *fmt, ...);

#define NCCL_NET_HANDLE_MAXSIZE 128 /* bytes of the opaque listen handle */
#define NCCL_NET_MAX_REQUESTS 32    /* outstanding requests per comm NCCL may create */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

/* Where the device side of a connection lives; HOST (0) for this plugin. */
typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1
} ncclNetDeviceType;

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

typedef struct {
  ncclNetDeviceType netDeviceType; /* offset 0 */
  int netDeviceVersion;            /* offset 4 */
  void *handle;                    /* offset 8 */
  size_t size;                     /* offset 16 */
  int needsProxyProgress;          /* offset 24 */
} ncclNetDeviceHandle_v8_t;        /* 32 bytes */

typedef struct {
  char *name;                      /* offset 0: unique per device */
  char *pciPath;                   /* offset 8: sysfs PCI path or NULL */
  uint64_t guid;                   /* offset 16 */
  int ptrSupport;                  /* offset 24: NCCL_PTR_* bits */
  int regIsGlobal;                 /* offset 28 */
  int speed;                       /* offset 32: Mbps */
  int port;                        /* offset 36 */
  float latency;                   /* offset 40: microseconds */
  int maxComms;                    /* offset 44 */
  int maxRecvs;                    /* offset 48: max buffers per grouped irecv */
  ncclNetDeviceType netDeviceType; /* offset 52 */
  int netDeviceVersion;            /* offset 56 */
} ncclNetProperties_v8_t;          /* 64 bytes (4 bytes of tail padding) */

/* The function table; member order is the ABI. */
typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v8_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v8_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                        void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                        void **mhandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t; /* 152 bytes */

/*
 * Version 7 (NCCL 2.19): the same 19 members, but the properties have no regIsGlobal and
 * regMr takes an int size. Exported as ncclNetPlugin_v7 so NCCL 2.19 can load the plugin;
 * newer NCCL probes v8 first.
 */
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v7_t;

typedef struct {
  char *name;                      /* offset 0 */
  char *pciPath;                   /* offset 8 */
  uint64_t guid;                   /* offset 16 */
  int ptrSupport;                  /* offset 24 */
  int speed;                       /* offset 28: Mbps */
  int port;                        /* offset 32 */
  float latency;                   /* offset 36: microseconds */
  int maxComms;                    /* offset 40 */
  int maxRecvs;                    /* offset 44 */
  ncclNetDeviceType netDeviceType; /* offset 48 */
  int netDeviceVersion;            /* offset 52 */
} ncclNetProperties_v7_t;          /* 56 bytes */

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v7_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v7_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, int size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                        void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                        void **mhandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v7_t; /* 152 bytes */

/* ---------------------------------------------------------------------------------------------
 * Constants of the newer versions (NCCL src/include/plugin/nccl_net.h, net_v10.h .. net_v12.h).
 */
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1 /* v9+: NCCL may preset *request to this in irecv */
#define NCCL_NET_MULTI_REQUEST 0x2            /* v11+: reserved */
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40)  /* 1 TiB: NCCL rejects maxP2pBytes above it */
#define NCCL_MAX_NET_SIZE_ASSUMED (1ULL << 30) /* 1 GiB: what NCCL assumes for v8 and older */
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ATTR_UNDEF (-1)
#define NCCL_NET_ID_UNDEF (-1)
#define NCCL_NET_MAX_DEVS_PER_NIC_V9 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8

/* v10+: the profiler callback NCCL passes to init (verbsnet records no profiler events). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *pHandle,
                                               int64_t pluginId, void *extData);

/* ---------------------------------------------------------------------------------------------
 * Version 9 (NCCL 2.24): isend/irecv sizes become size_t (iflush and test keep int), the
 * properties gain forceFlush, a virtual-device description and size limits, and the table a
 * makeVDevice slot (may be NULL). 20 members.
 */
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t; /* 20 bytes */

typedef struct {
  char *name;                      /* offset 0 */
  char *pciPath;                   /* offset 8 */
  uint64_t guid;                   /* offset 16 */
  int ptrSupport;                  /* offset 24 */
  int regIsGlobal;                 /* offset 28 */
  int forceFlush;                  /* offset 32 */
  int speed;                       /* offset 36: Mbps */
  int port;                        /* offset 40 */
  float latency;                   /* offset 44: microseconds */
  int maxComms;                    /* offset 48 */
  int maxRecvs;                    /* offset 52 */
  ncclNetDeviceType netDeviceType; /* offset 56 */
  int netDeviceVersion;            /* offset 60 */
  ncclNetVDeviceProps_v9_t vProps; /* offset 64 (20 bytes, then 4 bytes of padding) */
  size_t maxP2pBytes;              /* offset 88 */
  size_t maxCollBytes;             /* offset 96 */
} ncclNetProperties_v9_t;          /* 104 bytes */

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v9_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v9_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                        void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props);
} ncclNet_v9_t; /* 160 bytes */

/* ---------------------------------------------------------------------------------------------
 * Version 10 (NCCL 2.26): init takes the profiler callback; connect takes a per-connection
 * config (trafficClass; the pointer may be NULL); isend takes a profiler handle and irecv an
 * array of them. Properties as v9. 20 members.
 */
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  int trafficClass; /* NCCL_NET_TRAFFIC_CLASS_UNDEF (-1) when the user set none */
} ncclNetCommConfig_v10_t; /* 4 bytes */

typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t *config, void *handle,
                          void **sendComm, ncclNetDeviceHandle_v10_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v10_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                        void *phandle, void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **phandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v10_t *props);
} ncclNet_v10_t; /* 160 bytes */

/* ---------------------------------------------------------------------------------------------
 * Version 11 (NCCL 2.28): init is called once per communicator and returns a context (with the
 * communicator's id and config); listen and connect take that context (connect lost its config
 * argument); finalize(ctx) ends it; setNetAttr (may be NULL) passes tuning hints. Properties
 * gain maxMultiRequestSize. 22 members.
 */
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v11_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;

typedef struct {
  char *name;                       /* offset 0 */
  char *pciPath;                    /* offset 8 */
  uint64_t guid;                    /* offset 16 */
  int ptrSupport;                   /* offset 24 */
  int regIsGlobal;                  /* offset 28 */
  int forceFlush;                   /* offset 32 */
  int speed;                        /* offset 36 */
  int port;                         /* offset 40 */
  float latency;                    /* offset 44 */
  int maxComms;                     /* offset 48 */
  int maxRecvs;                     /* offset 52 */
  ncclNetDeviceType netDeviceType;  /* offset 56 */
  int netDeviceVersion;             /* offset 60 */
  ncclNetVDeviceProps_v11_t vProps; /* offset 64 */
  size_t maxP2pBytes;               /* offset 88 */
  size_t maxCollBytes;              /* offset 96 */
  int maxMultiRequestSize;          /* offset 104 */
} ncclNetProperties_v11_t;          /* 112 bytes */

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t; /* 16 bytes */

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v11_t; /* 44 bytes */

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t *props);
  ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v11_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v11_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                        void *phandle, void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **phandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v11_t *props);
  ncclResult_t (*finalize)(void *ctx);
  ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v11_t *netAttr);
} ncclNet_v11_t; /* 176 bytes */

/* ---------------------------------------------------------------------------------------------
 * Version 12 (NCCL 2.30): the functions of v11; the virtual device lists up to 8 devices and
 * the properties gain railId and planeId, so their layout differs from v11. 22 members.
 */
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v12_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;
typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t; /* 36 bytes */

typedef struct {
  char *name;                       /* offset 0 */
  char *pciPath;                    /* offset 8 */
  uint64_t guid;                    /* offset 16 */
  int ptrSupport;                   /* offset 24 */
  int regIsGlobal;                  /* offset 28 */
  int forceFlush;                   /* offset 32 */
  int speed;                        /* offset 36 */
  int port;                         /* offset 40 */
  float latency;                    /* offset 44 */
  int maxComms;                     /* offset 48 */
  int maxRecvs;                     /* offset 52 */
  ncclNetDeviceType netDeviceType;  /* offset 56 */
  int netDeviceVersion;             /* offset 60 */
  ncclNetVDeviceProps_v12_t vProps; /* offset 64 (36 bytes, then 4 bytes of padding) */
  size_t maxP2pBytes;               /* offset 104 */
  size_t maxCollBytes;              /* offset 112 */
  int maxMultiRequestSize;          /* offset 120 */
  int16_t railId;                   /* offset 124: NCCL_NET_ID_UNDEF when unknown */
  int16_t planeId;                  /* offset 126: NCCL_NET_ID_UNDEF when unknown */
} ncclNetProperties_v12_t;          /* 128 bytes */

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v12_t *config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t *props);
  ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v12_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v12_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                        void *phandle, void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **phandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
  ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v12_t *props);
  ncclResult_t (*finalize)(void *ctx);
  ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v12_t *netAttr);
} ncclNet_v12_t; /* 176 bytes */

#endif /* VERBSNET_NET_H */
