/*
 * verbsnet's own description of the NCCL network-plugin ABI, version 8 (and version 7 at the end).
 *
 * Written for this project from the facts collected in docs (sizes, field
 * order and constants measured on x86_64 / LP64). It is not a copy of any
 * NCCL header: names follow NCCL's spelling only where the ABI makes the
 * name part of the contract (the exported symbol ncclNetPlugin_v8) or where
 * users search for it in logs and docs.
 *
 * Layout checks (asserted at compile time in plugin/ffi/abi.rs):
 *   sizeof(ncclNet_v8_t)            == 152 (19 pointers)
 *   sizeof(ncclNetProperties_v8_t)  == 64
 *   sizeof(ncclNetDeviceHandle_v8_t)== 32
 */
#ifndef VERBSNET_NET_V8_H
#define VERBSNET_NET_V8_H

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

#endif /* VERBSNET_NET_V8_H */
