/*
 * verbsnet-perf's logger for the plugin under test: a function with the signature of NCCL's
 * ncclDebugLogger_t (printf-style, C-variadic), which stable Rust cannot define.
 *
 * NCCL passes its ncclDebugLog to the plugin's init, and plugins call it unconditionally
 * (src/plugin/net.cc: ncclNetPluginInit; the logger itself is in src/debug.cc). This one only
 * formats the message (vsnprintf, no length limit) and hands the finished text to the sink
 * the harness registered (testharness/src/plugin/logger.rs), which filters, prefixes and
 * prints it as NCCL would. Thread-safe: plugins may log from their own threads.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* level: ncclDebugLogLevel; flags: ncclDebugLogSubSys bits; file: NCCL's "filefunc". */
typedef void (*vnperf_log_sink_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *msg, size_t len);

static vnperf_log_sink_t vnperf_sink;

void vnperf_log_set_sink(vnperf_log_sink_t sink) {
  __atomic_store_n(&vnperf_sink, sink, __ATOMIC_RELEASE);
}

/* The ABI type: void (*)(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...),
 * with the enum passed as an int. */
void vnperf_nccl_log(int level, unsigned long flags, const char *file, int line, const char *fmt,
                     ...) {
  vnperf_log_sink_t sink = __atomic_load_n(&vnperf_sink, __ATOMIC_ACQUIRE);
  if (sink == NULL) return;
  if (fmt == NULL) fmt = "(null format)";
  char small[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    static const char bad[] = "(the plugin passed a format vsnprintf rejects)";
    sink(level, flags, file, line, bad, sizeof bad - 1);
    return;
  }
  if ((size_t)n < sizeof small) {
    sink(level, flags, file, line, small, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (big == NULL) {
    sink(level, flags, file, line, small, sizeof small - 1);
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sink(level, flags, file, line, big, (size_t)n);
  free(big);
}
