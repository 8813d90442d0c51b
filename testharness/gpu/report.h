/*
 * Host-side logic of the stock-NCCL GPU check (docs/gpu-check.md): size sweep, argument
 * parsing, the data pattern and its check, bandwidth, and the nccl-tests-style table.
 *
 * Plain C with no CUDA or NCCL types, so it is compiled and unit-tested on machines without
 * a GPU (testharness/gpu/selftest.sh) and linked unchanged into allreduce_check.cu by nvcc.
 */
#ifndef VERBSNET_GPU_REPORT_H
#define VERBSNET_GPU_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a byte count: decimal digits with an optional K, M or G suffix (powers of 1024,
 * upper or lower case, an optional trailing 'B' or "iB"). Returns 0 and writes *out on
 * success, -1 on anything else (empty, junk, overflow). */
int vn_parse_bytes(const char *text, size_t *out);

/* Fills sizes[] with min, min*factor, ... while <= max (at most cap entries), each rounded
 * down to a multiple of elem_size and never below elem_size. Returns the number written,
 * or 0 when the arguments make no sweep (min > max, factor < 2, elem_size 0). */
size_t vn_size_sweep(size_t min_bytes, size_t max_bytes, size_t factor, size_t elem_size,
                     size_t *sizes, size_t cap);

/* Timed iterations for one size: about budget_bytes of all_reduce payload per size, clamped
 * to [min_iters, max_iters], so the large sizes stay within the device-time budget. */
int vn_iters_for_size(size_t bytes, size_t budget_bytes, int min_iters, int max_iters);

/* The value rank `rank` contributes at element i for the sweep step `seed`. Small integers
 * (< 2^12), so any sum over up to 4096 ranks is exact in float. */
float vn_value(int rank, size_t i, unsigned seed);

/* Writes vn_value(rank, i, seed) for i in [0, count). */
void vn_fill(float *buf, size_t count, int rank, unsigned seed);

/* The exact all_reduce(sum) result at element i for nranks ranks. */
float vn_expected_sum(int nranks, size_t i, unsigned seed);

/* Counts elements of got[] that differ from vn_expected_sum (NaN counts as wrong). When
 * first_bad is not NULL it receives the index of the first wrong element (or count). */
size_t vn_count_wrong(const float *got, size_t count, int nranks, unsigned seed,
                      size_t *first_bad);

/* algbw = bytes / time, in GB/s (1e9 bytes per second), as nccl-tests reports it. */
double vn_algbw_gbs(size_t bytes, double time_us);

/* busbw for all_reduce: algbw * 2(n-1)/n. */
double vn_allreduce_busbw_gbs(size_t bytes, double time_us, int nranks);

/* The table, nccl-tests style. vn_table_header prints the two comment lines, vn_table_row
 * one data row, vn_table_footer the summary lines. The row format is parsed by
 * run-gpu-check.sh: keep "size count type redop time algbw busbw wrong" in that order. */
void vn_table_header(FILE *f);
void vn_table_row(FILE *f, size_t bytes, size_t elem_size, const char *type,
                  const char *redop, double time_us, int nranks, uint64_t wrong);
void vn_table_footer(FILE *f, uint64_t total_wrong, double busbw_sum, size_t rows);

#ifdef __cplusplus
}
#endif

#endif /* VERBSNET_GPU_REPORT_H */
