/* cpu_vecdot_scalar: the portable tile, in plain C: the order of the
 * chain every kernel follows (cpu_vecdot.h's DESIGN note), the kernel of
 * last resort, and the reference the tests hold every other kernel to. */
#include "../../core/kg_log.h"
#include "cpu_vecdot_int.h"

#include <math.h>
#include <stdlib.h>

/* Rows [i0, i0 + rm) of a against panel rows [col0, col0 + rn), results for
 * panel rows below nc stored at c[(i - i0) * ldc + (col - col0)]. */
static void tile_scalar(const cpu_qtraits_t *tr,
                        const cpu_qpanel_t *p,
                        int col0,
                        int rn,
                        const cpu_qact_t *a,
                        int64_t i0,
                        int rm,
                        float *c,
                        int64_t ldc,
                        int nc) {
    const int64_t k = p->k, m = a->m, blk = tr->blk;
    for (int r = 0; r < rm; r++) {
        const int64_t i = i0 + r;
        const int8_t *aq = a->qs + i * k;
        for (int jj = 0; jj < rn; jj++) {
            const int col = col0 + jj;
            if (col >= nc) {
                continue;
            }
            const int8_t *w = p->w + (int64_t)col * k;
            float acc = 0.0f, macc = 0.0f;
            for (int64_t b = 0; b < k / blk; b++) {
                int32_t isum = 0;
                for (int64_t e = b * blk; e < (b + 1) * blk; e++) {
                    int s = 1;
                    if (tr->scaled) {
                        const uint32_t pr = p->sc[(int64_t)col * (k / 32) + e / 32];
                        s = (int16_t)(uint16_t)(e % 32 < 16 ? pr : pr >> 16);
                    }
                    isum += s * (w[e] - tr->offset) * aq[e];
                }
                const float da = a->d[b * m + i];
                acc = fmaf(p->d[b * NP + col] * da, (float)isum, acc);
                if (tr->min_m) {
                    macc = fmaf(p->dm[b * NP + col], a->s[b * m + i], macc);
                } else if (tr->min_k) {
                    int32_t msum = 0;
                    for (int j = 0; j < 16; j++) {
                        msum += p->mins[(int64_t)col * (k / 16) + b * 16 + j] *
                                a->bsums[i * (k / 16) + b * 16 + j];
                    }
                    macc = fmaf(-(p->dm[b * NP + col] * da), (float)msum, macc);
                }
            }
            c[r * ldc + jj] = tr->min_m || tr->min_k ? acc + macc : acc;
        }
    }
}

void cpu_vecdot_scalar_rows(const cpu_qtraits_t *tr,
                            const cpu_qpanel_t *p,
                            int nc,
                            const cpu_qact_t *a,
                            int64_t i1,
                            int64_t i2,
                            float *c,
                            int64_t ldc) {
    for (int64_t i = i1; i < i2; i++) {
        tile_scalar(tr, p, 0, NP, a, i, 1, c + i * ldc, ldc, nc);
    }
}

// ---- reference ----

float cpu_vecdot_ref(const cpu_qmat_t *w, int64_t j, const cpu_qact_t *a, int64_t i) {
    cpu_qpanel_t p;
    void *mem = aligned_alloc(64, (cpu_qpanel_size(w->k) + 63) & ~(size_t)63);
    KG_ASSERT(mem != NULL);
    cpu_qpanel_init(&p, mem, w->k);
    cpu_quant_unpack(w->tr, (const char *)w->data + (size_t)j * w->row_size, w->row_size, 1, &p);
    float out;
    tile_scalar(w->tr, &p, 0, 1, a, i, 1, &out, 1, 1);
    free(mem);
    return out;
}
