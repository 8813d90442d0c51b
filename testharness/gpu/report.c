/* Host-side logic of the stock-NCCL GPU check; see report.h. */
#include "report.h"

#include <ctype.h>
#include <stdlib.h>

int vn_parse_bytes(const char *text, size_t *out)
{
    if (text == NULL || out == NULL || !isdigit((unsigned char)text[0])) {
        return -1;
    }
    size_t value = 0;
    const char *p = text;
    while (isdigit((unsigned char)*p)) {
        size_t digit = (size_t)(*p - '0');
        if (value > (SIZE_MAX - digit) / 10) {
            return -1;
        }
        value = value * 10 + digit;
        p++;
    }
    size_t shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    default: break;
    }
    if (shift != 0 && *p == 'i') {
        p++;
        if (*p != 'B' && *p != 'b') {
            return -1;
        }
    }
    if (*p == 'B' || *p == 'b') {
        p++;
    }
    if (*p != '\0') {
        return -1;
    }
    if (shift != 0 && value > (SIZE_MAX >> shift)) {
        return -1;
    }
    *out = value << shift;
    return 0;
}

size_t vn_size_sweep(size_t min_bytes, size_t max_bytes, size_t factor, size_t elem_size,
                     size_t *sizes, size_t cap)
{
    if (elem_size == 0 || factor < 2 || min_bytes > max_bytes || sizes == NULL) {
        return 0;
    }
    size_t n = 0;
    size_t s = min_bytes;
    while (n < cap && s <= max_bytes) {
        size_t rounded = s - s % elem_size;
        if (rounded < elem_size) {
            rounded = elem_size;
        }
        if (rounded <= max_bytes && (n == 0 || rounded > sizes[n - 1])) {
            sizes[n++] = rounded;
        }
        if (s > max_bytes / factor) {
            break;
        }
        s *= factor;
    }
    return n;
}

int vn_iters_for_size(size_t bytes, size_t budget_bytes, int min_iters, int max_iters)
{
    if (max_iters < min_iters) {
        max_iters = min_iters;
    }
    if (bytes == 0) {
        return max_iters;
    }
    size_t n = budget_bytes / bytes;
    if (n < (size_t)min_iters) {
        return min_iters;
    }
    if (n > (size_t)max_iters) {
        return max_iters;
    }
    return (int)n;
}

float vn_value(int rank, size_t i, unsigned seed)
{
    /* 1..1021: distinct per rank and per position, so a result that is one rank's own data
     * doubled, shifted by an element, or left over from the previous size is caught. */
    size_t v = (i * 7u + (size_t)seed * 13u + (size_t)rank * 101u) % 1021u;
    return (float)(v + 1u);
}

void vn_fill(float *buf, size_t count, int rank, unsigned seed)
{
    for (size_t i = 0; i < count; i++) {
        buf[i] = vn_value(rank, i, seed);
    }
}

float vn_expected_sum(int nranks, size_t i, unsigned seed)
{
    float sum = 0.0f;
    for (int r = 0; r < nranks; r++) {
        sum += vn_value(r, i, seed);
    }
    return sum;
}

size_t vn_count_wrong(const float *got, size_t count, int nranks, unsigned seed,
                      size_t *first_bad)
{
    size_t wrong = 0;
    size_t first = count;
    for (size_t i = 0; i < count; i++) {
        float want = vn_expected_sum(nranks, i, seed);
        /* Exact compare: every partial sum is a small integer, so the order of reduction
         * cannot change the result. NaN != anything, so NaN counts as wrong. */
        if (!(got[i] == want)) {
            if (wrong == 0) {
                first = i;
            }
            wrong++;
        }
    }
    if (first_bad != NULL) {
        *first_bad = first;
    }
    return wrong;
}

double vn_algbw_gbs(size_t bytes, double time_us)
{
    if (!(time_us > 0.0)) {
        return 0.0;
    }
    return (double)bytes / (time_us * 1e-6) / 1e9;
}

double vn_allreduce_busbw_gbs(size_t bytes, double time_us, int nranks)
{
    if (nranks < 1) {
        return 0.0;
    }
    return vn_algbw_gbs(bytes, time_us) * (2.0 * (double)(nranks - 1) / (double)nranks);
}

void vn_table_header(FILE *f)
{
    fprintf(f, "#%13s %14s %8s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop",
            "time", "algbw", "busbw", "#wrong");
    fprintf(f, "#%13s %14s %8s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)",
            "(GB/s)", "(GB/s)", "");
    fflush(f);
}

void vn_table_row(FILE *f, size_t bytes, size_t elem_size, const char *type,
                  const char *redop, double time_us, int nranks, uint64_t wrong)
{
    double algbw = vn_algbw_gbs(bytes, time_us);
    double busbw = vn_allreduce_busbw_gbs(bytes, time_us, nranks);
    fprintf(f, " %13zu %14zu %8s %6s %11.2f %8.3f %8.3f %7llu\n", bytes,
            elem_size ? bytes / elem_size : (size_t)0, type, redop, time_us, algbw, busbw,
            (unsigned long long)wrong);
    fflush(f);
}

void vn_table_footer(FILE *f, uint64_t total_wrong, double busbw_sum, size_t rows)
{
    fprintf(f, "# Out of bounds values : %llu %s\n", (unsigned long long)total_wrong,
            total_wrong == 0 ? "OK" : "FAILED");
    fprintf(f, "# Avg bus bandwidth    : %.4f\n", rows ? busbw_sum / (double)rows : 0.0);
    fprintf(f, "# Rows                 : %zu\n", rows);
    fflush(f);
}
