/* cpu_vecdot: the dispatch: which kernel family runs (what the build and
 * the CPU have, or what cpu_vecdot_set_kernel asked for), the per-thread
 * scratch, and the threaded driver that cuts a product into tasks of
 * panels and hands each panel to its family's tiles (cpu_vecdot_int.h
 * lists the families; cpu_vecdot.h has the numerics and why they are
 * batch invariant). */
#include "cpu_vecdot.h"

#include "../../core/kg_log.h"
#include "../../core/kg_pool.h"
#include "../../model/kg_quant.h"
#include "cpu_vecdot_int.h"

#include <stdlib.h>
#include <string.h>

#ifdef VECDOT_AVX2
#include <cpuid.h>
#endif

/* Products smaller than both of these run on the calling thread. A decode
 * step is bound by reading the weights, and a second thread halves that
 * for any matrix above ~128 KiB (the pool's workers poll between the
 * step's products, so a hand-off costs a few microseconds). */
#define INLINE_MACS  262144.0
#define INLINE_BYTES 131072.0

/* The kernel family in use: 0 scalar, 1 AVX2, 2 AVX2 with AVX-VNNI's
 * vpdpbusd for the 4-byte dot products (same integers, one instruction
 * instead of two), 3 the same instruction in its AVX512-VNNI form (EVEX,
 * on ymm registers with AVX512VL): the CPUs most servers run (Ice Lake and
 * later Xeons, AMD Zen 4 and 5) have that one and not AVX-VNNI. -1: not
 * chosen yet (the best the CPU has). */
static int kernel = -1;

#ifdef VECDOT_AVX2
/* CPUID.(EAX=7, ECX=1):EAX bit 4. Asked of cpuid directly: clang before 16
 * has no "avxvnni" for __builtin_cpu_supports (the fuzz build is clang 14). */
static bool has_avxvnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) {
        return false;
    }
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 4) & 1u;
}

/* AVX512_VNNI (CPUID.(7, 0):ECX bit 11) and AVX512VL (EBX bit 31), and the
 * OS saving the AVX-512 state (XCR0 bits 5-7): an EVEX instruction faults
 * without it, even on ymm registers. */
static bool has_avx512vnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) {
        return false;
    }
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1u)) { /* OSXSAVE: xgetbv may run */
        return false;
    }
    __cpuid_count(7, 0, a, b, c, d);
    if (!((c >> 11) & 1u) || !((b >> 31) & 1u)) {
        return false;
    }
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u; /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
}
#endif

/* Whether this build and CPU run kernel family i. */
static bool kernel_runs(int i) {
#ifdef VECDOT_AVX2
    return i == 0 || i == 1 || (i == 2 && has_avxvnni()) || (i == 3 && has_avx512vnni());
#else
    return i == 0;
#endif
}

/* The EVEX kernels first where the CPU has the rest of AVX-512 too: with
 * them one sequence's K-quant decode runs on zmm registers
 * (cpu_vecdot_decode512.c); the VEX ones next, where only they exist. */
static int best_kernel(void) {
    if (kernel_runs(3) && cpu_vecdot_decode512_has(KG_GGML_TYPE_Q4_K)) {
        return 3;
    }
    return kernel_runs(2) ? 2 : kernel_runs(3) ? 3 : kernel_runs(1) ? 1 : 0;
}

static int kernel_in_use(void) {
    if (kernel < 0) {
        kernel = best_kernel();
    }
    return kernel;
}

static const char *const kernel_names[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};

bool cpu_vecdot_set_kernel(const char *name) {
    if (name == NULL || strcmp(name, "best") == 0) {
        kernel = best_kernel();
        return true;
    }
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, kernel_names[i]) == 0 && kernel_runs(i)) {
            kernel = i;
            return true;
        }
    }
    return false;
}

const char *cpu_vecdot_kernel_name(void) {
    return kernel_names[kernel_in_use()];
}

/* The vpdpbusd encoding of the kernels in use: 0 none, 1 VEX, 2 EVEX. */
static int vnni_in_use(void) {
    const int k = kernel_in_use();
    return k >= 2 ? k - 1 : 0;
}

bool cpu_qmat_init(cpu_qmat_t *w, kg_ggml_type_t type, const void *data, int64_t n, int64_t k) {
    memset(w, 0, sizeof(*w));
    const cpu_qtraits_t *tr = cpu_qtraits(type);
    if (!tr || k % tr->blk != 0) {
        return false;
    }
    w->tr = tr;
    w->data = data;
    w->n = n;
    w->k = k;
    w->row_size = kg_type_row_size(type, k);
    return true;
}

// ---- scratch ----

struct cpu_qgemm_scratch {
    int n_threads;
    int64_t max_k;
    size_t panel_size; /* bytes of one panel */
    char *mem;         /* (n_threads, TASK_PANELS, panel_size) */
};

cpu_qgemm_scratch_t *cpu_qgemm_scratch_new(int n_threads, int64_t max_k) {
    cpu_qgemm_scratch_t *s = calloc(1, sizeof(*s));
    if (!s) {
        return NULL;
    }
    s->n_threads = n_threads;
    s->max_k = max_k;
    s->panel_size = (cpu_qpanel_size(max_k) + 63) & ~(size_t)63;
    /* the fused decode tiles' buffers (fused_buf_t) fit the same space */
    const size_t nb32 = (size_t)max_k / 32, ng32 = (nb32 + 7) / 8, ng256 = (max_k / 256 + 7) / 8;
    const size_t fused = (FUSED_MAX_ROWS_32 - 1) * ng32 * NP * 32 +
                         (size_t)(FUSED_MAX_ROWS_K - 1) * 2 * ng256 * NP * 32 +
                         2 * nb32 * NP * sizeof(uint16_t);
    while ((size_t)TASK_PANELS * s->panel_size < fused) {
        s->panel_size += 64;
    }
    s->mem = aligned_alloc(64, (size_t)n_threads * TASK_PANELS_MAX * s->panel_size);
    if (!s->mem) {
        free(s);
        return NULL;
    }
    return s;
}

void cpu_qgemm_scratch_free(cpu_qgemm_scratch_t *s) {
    if (s) {
        free(s->mem);
        free(s);
    }
}

size_t cpu_qgemm_scratch_size(const cpu_qgemm_scratch_t *s) {
    return (size_t)s->n_threads * TASK_PANELS_MAX * s->panel_size;
}

// ---- driver ----

/* Rows [i1, i2) of a against one unpacked panel (its first nc rows valid):
 * c[i * ldc + j] for the panel's columns. */
static void panel_rows(const cpu_qtraits_t *tr,
                       const cpu_qpanel_t *p,
                       int nc,
                       const cpu_qact_t *a,
                       int64_t i1,
                       int64_t i2,
                       float *c,
                       int64_t ldc) {
#ifdef VECDOT_AVX2
    if (vnni_in_use()) {
        cpu_vecdot_vnni_rows(vnni_in_use(), tr, p, nc, a, i1, i2, c, ldc);
        return;
    }
    if (kernel_in_use() > 0) {
        cpu_vecdot_avx2_rows(tr, p, nc, a, i1, i2, c, ldc);
        return;
    }
#endif
    cpu_vecdot_scalar_rows(tr, p, nc, a, i1, i2, c, ldc);
}

typedef struct qgemm_job {
    cpu_qgemm_scratch_t *scratch;
    const cpu_qact_t *a;
    int n_w;
    const cpu_qmat_t *const *w;
    float *const *c;
    int64_t panels_per_task;
    int64_t first_task[CPU_QGEMM_MAX_W + 1]; /* tasks of w[i]: [first_task[i], first_task[i+1]) */
} qgemm_job_t;

static void qgemm_task(void *arg, int64_t task, int thread) {
    const qgemm_job_t *j = arg;
    int wi = 0;
    while (task >= j->first_task[wi + 1]) {
        wi++;
    }
    const cpu_qmat_t *w = j->w[wi];
    const cpu_qact_t *a = j->a;
    float *c = j->c[wi];
    const int64_t n_panels = (w->n + NP - 1) / NP;
    const int64_t p0 = (task - j->first_task[wi]) * j->panels_per_task;
    const int64_t p1 = p0 + j->panels_per_task < n_panels ? p0 + j->panels_per_task : n_panels;
#ifdef VECDOT_AVX2
    if (a->m < (w->tr->blk == 32 ? FUSED_MAX_ROWS_32 : FUSED_MAX_ROWS_K) && kernel_in_use() > 0) {
        /* decode: the blocks are met in place (cpu_vecdot_decode.c) */
        char *mem = j->scratch->mem + (size_t)thread * TASK_PANELS * j->scratch->panel_size;
        cpu_vecdot_decode(vnni_in_use(), w, a, mem, p0, p1, c);
        return;
    }
#endif
    char *mem = j->scratch->mem + (size_t)thread * TASK_PANELS * j->scratch->panel_size;
    cpu_qpanel_t panels[TASK_PANELS];
    int ncs[TASK_PANELS];
    for (int64_t p = p0; p < p1; p++) {
        cpu_qpanel_t *pp = &panels[p - p0];
        cpu_qpanel_init(pp, mem + (size_t)(p - p0) * j->scratch->panel_size, w->k);
        const int64_t r0 = p * NP;
        ncs[p - p0] = (int)(w->n - r0 < NP ? w->n - r0 : NP);
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * w->row_size;
#ifdef VECDOT_AVX2
        if (vnni_in_use()) {
            cpu_vecdot_vnni_panel(vnni_in_use(), w->tr, src, w->row_size, ncs[p - p0], pp);
            continue;
        }
#endif
        cpu_quant_unpack(w->tr, src, w->row_size, ncs[p - p0], pp);
    }
    for (int64_t i1 = 0; i1 < a->m; i1 += MC) {
        const int64_t i2 = i1 + MC < a->m ? i1 + MC : a->m;
        for (int64_t p = p0; p < p1; p++) {
            /* the loop above ran p over the same [p0, p1) and set ncs[p - p0] for each (the
             * analyzer, lost in the symbolic p0 and p1, takes one loop empty and not the other) */
            // NOLINTNEXTLINE(clang-analyzer-core.CallAndMessage)
            panel_rows(w->tr, &panels[p - p0], ncs[p - p0], a, i1, i2, c + p * NP, w->n);
        }
    }
}

static void qgemm_run(struct kg_pool *pool,
                      int thread,
                      cpu_qgemm_scratch_t *scratch,
                      const cpu_qact_t *a,
                      int n_w,
                      const cpu_qmat_t *const *w,
                      float *const *c) {
    KG_ASSERT(n_w >= 1 && n_w <= CPU_QGEMM_MAX_W);
    qgemm_job_t j = {.scratch = scratch, .a = a, .n_w = n_w, .w = w, .c = c};
    int64_t n_panels = 0;
    double macs = 0.0, bytes = 0.0;
    for (int i = 0; i < n_w; i++) {
        KG_ASSERT(w[i]->k == a->k && w[i]->k <= scratch->max_k && w[i]->tr->act == a->kind);
        n_panels += (w[i]->n + NP - 1) / NP;
        macs += (double)a->m * (double)w[i]->n * (double)w[i]->k;
        bytes += (double)w[i]->n * (double)w[i]->row_size;
    }
    if (a->m <= 0 || n_panels == 0) {
        return;
    }
    const int n_threads = pool ? kg_pool_n_threads(pool) : 1;
    const bool serial = n_threads == 1 || (macs < INLINE_MACS && bytes < INLINE_BYTES);
    /* two tuning knobs, equal today (hence the clone warning), each free to change */
    // NOLINTNEXTLINE(bugprone-branch-clone)
    const int64_t cap = a->m <= 16 ? TASK_PANELS_DECODE : TASK_PANELS;
    const int64_t nt = serial ? 1 : n_threads;
    /* tasks of at most cap panels, about a multiple of the thread count */
    const int64_t n_tasks = nt * ((n_panels + nt * cap - 1) / (nt * cap));
    j.panels_per_task = (n_panels + n_tasks - 1) / n_tasks;
    for (int i = 0; i < n_w; i++) {
        const int64_t np = (w[i]->n + NP - 1) / NP;
        j.first_task[i + 1] = j.first_task[i] + (np + j.panels_per_task - 1) / j.panels_per_task;
    }
    if (serial) {
        for (int64_t t = 0; t < j.first_task[n_w]; t++) {
            qgemm_task(&j, t, thread);
        }
        return;
    }
    kg_pool_run(pool, j.first_task[n_w], qgemm_task, &j);
}

void cpu_qgemm(struct kg_pool *pool,
               cpu_qgemm_scratch_t *scratch,
               const cpu_qact_t *a,
               int n_w,
               const cpu_qmat_t *const *w,
               float *const *c) {
    qgemm_run(pool, 0, scratch, a, n_w, w, c);
}

void cpu_qgemm_serial(cpu_qgemm_scratch_t *scratch,
                      int thread,
                      const cpu_qact_t *a,
                      int n_w,
                      const cpu_qmat_t *const *w,
                      float *const *c) {
    KG_ASSERT(thread >= 0 && thread < scratch->n_threads);
    qgemm_run(NULL, thread, scratch, a, n_w, w, c);
}
