/* Unit tests for report.c (no GPU). Built and run by selftest.sh. */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed;
static int failed;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) {                                                              \
            passed++;                                                            \
        } else {                                                                 \
            failed++;                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(a) + fabs(b) + 1.0); }

static void test_parse_bytes(void)
{
    size_t v = 0;
    CHECK(vn_parse_bytes("8", &v) == 0 && v == 8);
    CHECK(vn_parse_bytes("256M", &v) == 0 && v == (size_t)256 << 20);
    CHECK(vn_parse_bytes("256MiB", &v) == 0 && v == (size_t)256 << 20);
    CHECK(vn_parse_bytes("1G", &v) == 0 && v == (size_t)1 << 30);
    CHECK(vn_parse_bytes("4k", &v) == 0 && v == 4096);
    CHECK(vn_parse_bytes("64KB", &v) == 0 && v == 65536);
    CHECK(vn_parse_bytes("100B", &v) == 0 && v == 100);
    CHECK(vn_parse_bytes("", &v) != 0);
    CHECK(vn_parse_bytes("M", &v) != 0);
    CHECK(vn_parse_bytes("-1", &v) != 0);
    CHECK(vn_parse_bytes("12X", &v) != 0);
    CHECK(vn_parse_bytes("1Mi", &v) != 0);
    CHECK(vn_parse_bytes("99999999999999999999999", &v) != 0);
    CHECK(vn_parse_bytes("99999999999999G", &v) != 0);
    CHECK(vn_parse_bytes(NULL, &v) != 0);
}

static void test_size_sweep(void)
{
    size_t s[64];
    size_t n = vn_size_sweep(8, (size_t)256 << 20, 2, 4, s, 64);
    CHECK(n == 26); /* 2^3 .. 2^28 */
    CHECK(s[0] == 8 && s[1] == 16 && s[n - 1] == (size_t)256 << 20);
    int doubling = 1;
    for (size_t i = 1; i < n; i++) {
        doubling &= s[i] == 2 * s[i - 1];
    }
    CHECK(doubling);
    /* Rounded to whole elements, never below one, no duplicates. */
    n = vn_size_sweep(1, 64, 2, 4, s, 64);
    CHECK(n == 5 && s[0] == 4 && s[1] == 8 && s[4] == 64);
    n = vn_size_sweep(6, 100, 3, 4, s, 64); /* 6 18 54 -> 4 16 52 */
    CHECK(n == 3 && s[0] == 4 && s[1] == 16 && s[2] == 52);
    CHECK(vn_size_sweep(16, 8, 2, 4, s, 64) == 0);
    CHECK(vn_size_sweep(8, 16, 1, 4, s, 64) == 0);
    CHECK(vn_size_sweep(8, 1 << 20, 2, 4, s, 3) == 3);
    /* No overflow at the top of size_t. */
    n = vn_size_sweep((size_t)1 << 62, SIZE_MAX, 2, 4, s, 64);
    CHECK(n == 2);
}

static void test_iters(void)
{
    size_t gib = (size_t)1 << 30;
    CHECK(vn_iters_for_size(8, gib, 2, 20) == 20);
    CHECK(vn_iters_for_size((size_t)256 << 20, gib, 2, 20) == 4);
    CHECK(vn_iters_for_size((size_t)128 << 20, gib, 2, 20) == 8);
    CHECK(vn_iters_for_size(gib, gib / 4, 2, 20) == 2);
    CHECK(vn_iters_for_size(0, gib, 2, 20) == 20);
    CHECK(vn_iters_for_size(8, gib, 5, 3) == 5);
}

static void test_pattern_and_check(void)
{
    const size_t count = 1 << 16;
    float *a = (float *)malloc(count * sizeof(float));
    float *b = (float *)malloc(count * sizeof(float));
    float *sum = (float *)malloc(count * sizeof(float));
    vn_fill(a, count, 0, 3);
    vn_fill(b, count, 1, 3);
    int differs = 0;
    int in_range = 1;
    for (size_t i = 0; i < count; i++) {
        sum[i] = a[i] + b[i];
        in_range &= a[i] >= 1.0f && a[i] <= 1021.0f;
        differs |= a[i] != b[i];
        if (i > 0 && a[i] == a[i - 1]) {
            differs = -1000; /* neighbouring elements must differ (shift detection) */
        }
    }
    CHECK(in_range);
    CHECK(differs == 1);
    size_t first = 0;
    CHECK(vn_count_wrong(sum, count, 2, 3, &first) == 0 && first == count);
    /* Another seed (the previous size's data) is wrong everywhere but by chance. */
    CHECK(vn_count_wrong(sum, count, 2, 4, NULL) > count - count / 100);
    /* One rank's data doubled is wrong. */
    for (size_t i = 0; i < count; i++) {
        b[i] = 2.0f * a[i];
    }
    CHECK(vn_count_wrong(b, count, 2, 3, NULL) > count / 2);
    /* A NaN (memset 0xff, never written) and one off-by-one are counted, first found. */
    memset(&sum[10], 0xff, sizeof(float));
    sum[500] += 1.0f;
    CHECK(vn_count_wrong(sum, count, 2, 3, &first) == 2 && first == 10);
    /* Exact in float for many ranks. */
    CHECK(vn_expected_sum(4096, 12345, 7) == floorf(vn_expected_sum(4096, 12345, 7)));
    CHECK(vn_expected_sum(1, 5, 2) == vn_value(0, 5, 2));
    free(a);
    free(b);
    free(sum);
}

static void test_bandwidth(void)
{
    /* 1 GB in 1 s: algbw 1 GB/s; 2 ranks busbw = algbw; 4 ranks 1.5x; 8 ranks 1.75x. */
    CHECK(near(vn_algbw_gbs(1000000000u, 1e6), 1.0));
    CHECK(near(vn_allreduce_busbw_gbs(1000000000u, 1e6, 2), 1.0));
    CHECK(near(vn_allreduce_busbw_gbs(1000000000u, 1e6, 4), 1.5));
    CHECK(near(vn_allreduce_busbw_gbs(1000000000u, 1e6, 8), 1.75));
    CHECK(near(vn_allreduce_busbw_gbs(1000000000u, 1e6, 1), 0.0));
    CHECK(vn_algbw_gbs(8, 0.0) == 0.0);
    CHECK(near(vn_algbw_gbs((size_t)256 << 20, 100000.0), 2.68435456));
}

static void test_table(void)
{
    FILE *f = tmpfile();
    vn_table_header(f);
    vn_table_row(f, (size_t)256 << 20, 4, "float", "sum", 123456.78, 2, 0);
    vn_table_row(f, 8, 4, "float", "sum", 12.5, 2, 3);
    vn_table_footer(f, 3, 4.0, 2);
    rewind(f);
    char line[512];
    int rows = 0;
    int comments = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (line[0] == '#') {
            comments++;
            continue;
        }
        size_t size = 0;
        size_t count = 0;
        char type[16];
        char redop[16];
        double t = 0;
        double alg = 0;
        double bus = 0;
        unsigned long long wrong = 0;
        int got = sscanf(line, "%zu %zu %15s %15s %lf %lf %lf %llu", &size, &count, type, redop,
                         &t, &alg, &bus, &wrong);
        CHECK(got == 8);
        CHECK(strcmp(type, "float") == 0 && strcmp(redop, "sum") == 0);
        CHECK(count * 4 == size);
        if (rows == 0) {
            CHECK(size == (size_t)256 << 20 && wrong == 0 && near(t, 123456.78));
            CHECK(fabs(alg - 2.174) < 0.001 && fabs(bus - alg) < 1e-9);
        } else {
            CHECK(size == 8 && wrong == 3);
        }
        rows++;
    }
    CHECK(rows == 2);
    CHECK(comments == 5);
    fclose(f);

    f = tmpfile();
    vn_table_footer(f, 0, 3.0, 2);
    rewind(f);
    CHECK(fgets(line, sizeof(line), f) != NULL && strstr(line, "Out of bounds values : 0 OK") != NULL);
    CHECK(fgets(line, sizeof(line), f) != NULL && strstr(line, "1.5000") != NULL);
    fclose(f);
}

int main(void)
{
    test_parse_bytes();
    test_size_sweep();
    test_iters();
    test_pattern_and_check();
    test_bandwidth();
    test_table();
    printf("report_test: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
