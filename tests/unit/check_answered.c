/* check_answered: the jobs answered above a committed offset, from the worker that gives a
 * partition up to the next owner (kg_answered.h): the offsets tracker lists what it finished
 * behind a running job (with a previous owner's list it has not reached yet), the commit
 * metadata carries them within the size cap, the next owner decodes exactly them and ignores
 * metadata that is not kgen's or is malformed. */
#include "check_common.h"
#include "kafka/kg_answered.h"
#include "kafka/kg_offsets.h"

#include <string.h>

START_TEST(encode_decode) {
    char md[KG_ANSWERED_MAX_BYTES + 1];
    int64_t offs[] = {11, 12, 15, 1000};
    ck_assert_uint_eq(kg_answered_encode(10, offs, 4, md, sizeof(md)), 4);
    ck_assert_str_eq(md, "kgen-answered:1,2,5,990");
    int64_t out[8];
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), 10, out, 8), 4);
    ck_assert(out[0] == 11 && out[1] == 12 && out[2] == 15 && out[3] == 1000);
    /* at most max */
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), 10, out, 2), 2);
    /* offsets not above the committed one, or not ascending, are left out */
    int64_t odd[] = {9, 10, 12, 12, 11, 14};
    ck_assert_uint_eq(kg_answered_encode(10, odd, 6, md, sizeof(md)), 2);
    ck_assert_str_eq(md, "kgen-answered:2,4");
    /* a small buffer: a prefix of them */
    char small[18]; /* "kgen-answered:1,2" and its NUL */
    ck_assert_uint_eq(kg_answered_encode(10, offs, 4, small, sizeof(small)), 2);
    ck_assert_str_eq(small, "kgen-answered:1,2");
}
END_TEST

START_TEST(size_cap) {
    /* far more than fit: the metadata stays under the cap, and decodes to a prefix */
    enum { N = 5000 };
    static int64_t offs[N], out[N];
    for (int i = 0; i < N; i++) {
        offs[i] = 100000 + 2 * i;
    }
    static char md[KG_ANSWERED_MAX_BYTES * 2];
    size_t n = kg_answered_encode(99999, offs, N, md, sizeof(md));
    ck_assert_uint_gt(n, 100);
    ck_assert_uint_lt(n, N);
    ck_assert_uint_le(strlen(md), KG_ANSWERED_MAX_BYTES);
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), 99999, out, N), n);
    for (size_t i = 0; i < n; i++) {
        ck_assert(out[i] == offs[i]);
    }
}
END_TEST

START_TEST(not_ours) {
    int64_t out[8];
    static const char *const bad[] = {"",
                                      "hello",
                                      "kgen-answered",
                                      "KGEN-ANSWERED:1",
                                      "kgen-answered:0",
                                      "kgen-answered:-1",
                                      "kgen-answered:x",
                                      "kgen-answered:,1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(kg_answered_decode(bad[i], strlen(bad[i]), 10, out, 8) == 0, "%s", bad[i]);
    }
    /* a bad entry ends the list; what came before it stands */
    const char *md = "kgen-answered:1,3,2,9";
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), 10, out, 8), 2);
    md = "kgen-answered:1,2x";
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), 10, out, 8), 1);
    md = "kgen-answered:1,99999999999999999999";
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), 10, out, 8), 1);
    md = "kgen-answered:5"; /* no committed offset: nothing is above it */
    ck_assert_uint_eq(kg_answered_decode(md, strlen(md), -1, out, 8), 0);
    ck_assert_uint_eq(kg_answered_decode(NULL, 0, 10, out, 8), 0);
}
END_TEST

/* A worker takes 10..15, finishes 11, 12 and 14 while 10 runs: it commits 10 with 11, 12, 14. */
START_TEST(tracker_lists_done_above) {
    kg_offsets_t *o = kg_offsets_new(100);
    ck_assert(kg_offsets_assign(o, 3) == KG_OK);
    int64_t pos, out[16];
    ck_assert_uint_eq(kg_offsets_answered_above(o, 3, &pos, out, 16), 0);
    ck_assert(pos == -1); /* nothing taken, no committed offset known */
    for (int64_t off = 10; off <= 15; off++) {
        ck_assert(kg_offsets_track(o, 3, off) == KG_OK);
    }
    ck_assert(kg_offsets_done(o, 3, 11));
    ck_assert(kg_offsets_done(o, 3, 12));
    ck_assert(kg_offsets_done(o, 3, 14));
    ck_assert_uint_eq(kg_offsets_answered_above(o, 3, &pos, out, 16), 3);
    ck_assert(pos == 10 && out[0] == 11 && out[1] == 12 && out[2] == 14);
    ck_assert(kg_offsets_done(o, 3, 10)); /* the prefix moves past 12 */
    ck_assert_uint_eq(kg_offsets_answered_above(o, 3, &pos, out, 16), 1);
    ck_assert(pos == 13 && out[0] == 14);
    ck_assert(kg_offsets_done(o, 3, 13));
    ck_assert(kg_offsets_done(o, 3, 15));
    ck_assert_uint_eq(kg_offsets_answered_above(o, 3, &pos, out, 16), 0);
    ck_assert(pos == 16);
    kg_offsets_free(o);
}
END_TEST

/* The next owner gets 20 with 22 and 25 answered: it skips them as they come, and if it gives
 * the partition up before reaching 25, it passes 25 on with what it answered itself. */
START_TEST(previous_owner_list) {
    kg_offsets_t *o = kg_offsets_new(100);
    ck_assert(kg_offsets_assign(o, 0) == KG_OK);
    int64_t prev[] = {22, 25};
    ck_assert(kg_offsets_set_answered(o, 0, 20, prev, 2) == KG_OK);
    int64_t pos, out[16];
    /* given up at once: the list goes on as it came */
    ck_assert_uint_eq(kg_offsets_answered_above(o, 0, &pos, out, 16), 2);
    ck_assert(pos == 20 && out[0] == 22 && out[1] == 25);
    ck_assert(!kg_offsets_is_answered(o, 0, 20));
    ck_assert(kg_offsets_is_answered(o, 0, 22));
    ck_assert(kg_offsets_is_answered(o, 0, 25));
    ck_assert(!kg_offsets_is_answered(o, 0, 23));
    ck_assert(!kg_offsets_is_answered(o, 1, 22)); /* another partition */
    for (int64_t off = 20; off <= 23; off++) {
        ck_assert(kg_offsets_track(o, 0, off) == KG_OK);
    }
    ck_assert(kg_offsets_done(o, 0, 22)); /* skipped: done at once */
    ck_assert(kg_offsets_done(o, 0, 21)); /* answered here, behind 20 */
    ck_assert_uint_eq(kg_offsets_answered_above(o, 0, &pos, out, 16), 3);
    ck_assert(pos == 20 && out[0] == 21 && out[1] == 22 && out[2] == 25);
    ck_assert(kg_offsets_done(o, 0, 20));
    ck_assert_uint_eq(kg_offsets_answered_above(o, 0, &pos, out, 16), 1);
    ck_assert(pos == 23 && out[0] == 25);
    /* a revoke forgets the list */
    kg_offsets_revoke(o, 0);
    ck_assert(kg_offsets_assign(o, 0) == KG_OK);
    ck_assert(!kg_offsets_is_answered(o, 0, 25));
    ck_assert(kg_offsets_set_answered(o, 7, 0, prev, 2) == KG_ERR_INVALID); /* not assigned */
    kg_offsets_free(o);
}
END_TEST

/* Counting items as a list grows (kg_answered_item_bytes) says exactly when the encoding
 * holds the whole list: the transactions grow their lists that way. */
START_TEST(item_bytes_match_the_encoding) {
    static int64_t offs[2048];
    char md[KG_ANSWERED_MAX_BYTES + 1];
    const int64_t committed = 100;
    int64_t off = committed;
    size_t bytes = 0, n = 0;
    uint64_t r = 12345;
    for (;;) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        off += 1 + (int64_t)((r >> 33) % 100000); /* deltas of 1 to 6 or 7 digits */
        size_t b = kg_answered_item_bytes(committed, off);
        bool fits = strlen(KG_ANSWERED_PREFIX) + bytes + b - 1 <= KG_ANSWERED_MAX_BYTES;
        offs[n] = off;
        size_t held = kg_answered_encode(committed, offs, n + 1, md, sizeof(md));
        ck_assert_uint_eq(held, fits ? n + 1 : n);
        if (!fits) {
            break;
        }
        bytes += b;
        n++;
    }
    ck_assert_uint_gt(n, 100);
    ck_assert_uint_eq(kg_answered_item_bytes(10, 11), 2);   /* "1," */
    ck_assert_uint_eq(kg_answered_item_bytes(10, 1010), 5); /* "1000," */
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("answered");
    TCase *tc = tcase_create("answered");
    tcase_add_test(tc, encode_decode);
    tcase_add_test(tc, item_bytes_match_the_encoding);
    tcase_add_test(tc, size_cap);
    tcase_add_test(tc, not_ours);
    tcase_add_test(tc, tracker_lists_done_above);
    tcase_add_test(tc, previous_owner_list);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
