/* Fused CPU loops for the mHC connections (auralm/models/mhc.py), every tensor contiguous.

   Eager PyTorch runs each step of a connection as its own pass over the n streams of every token (and its
   batched matrix products over 4x4 matrices loop over the tokens one small call at a time); here each
   function is one pass over the tokens, with a token's streams in the first-level cache while they are
   used. Tokens are split over `threads` POSIX threads; every token is computed by one thread in the same
   order whatever the split, so the results do not depend on the number of threads.

   The streams (x, their gradient, the new streams, and the sublayer's output f that is written into them) are
   of type `stream_t`: float, or with STREAM_BF16 defined bfloat16 (what the paper's kernels keep them in under
   bf16 training), loaded to float32 for every sum and rounded to the nearest even bfloat16 once, when stored.
   Everything else is float32: the coefficients, what the sublayer reads (inp) and its gradient.

   Shapes: T tokens, n streams, d features, m = 2n + n*n coefficients.
   x, grad, out, gx: (T, n, d); f, inp, g_inp: (T, d); pre, post: (T, n); res, logits: (T, n, n);
   z, coef: (T, m); W: (m, n*d). */

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef STREAM_BF16
typedef uint16_t stream_t;

static inline float ld(stream_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* round to nearest even, as torch's float -> bfloat16; a NaN stays a NaN (the trainer's guard looks for it) */
static inline stream_t st(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (stream_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}
#else
typedef float stream_t;

static inline float ld(stream_t v) { return v; }
static inline stream_t st(float f) { return f; }
#endif

/* VL floats at a time, in GCC's (and clang's) vector extension: one AVX-512 register, two AVX ones, four SSE
   ones, whatever the machine has. Sums are kept in named vectors so that they stay in registers. */
#define VL 16
typedef float vf __attribute__((vector_size(VL * sizeof(float))));

static inline vf vloadf(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstoref(float *p, vf v) { memcpy(p, &v, sizeof v); }

typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));

static inline float hsum(vf v) { /* halves added pairwise: a short chain, the same order every time */
    vf8 a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (const char *)&v + sizeof a, sizeof b);
    a += b;
    vf4 c, e;
    memcpy(&c, &a, sizeof c);
    memcpy(&e, (const char *)&a + sizeof c, sizeof e);
    c += e;
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* a . b over d floats, in four strands so that the additions do not wait on each other */
static inline float dot(const float *a, const float *b, int d) {
    vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int k = 0;
    for (; k + 4 * VL <= d; k += 4 * VL) {
        s0 += vloadf(a + k) * vloadf(b + k);
        s1 += vloadf(a + k + VL) * vloadf(b + k + VL);
        s2 += vloadf(a + k + 2 * VL) * vloadf(b + k + 2 * VL);
        s3 += vloadf(a + k + 3 * VL) * vloadf(b + k + 3 * VL);
    }
    for (; k + VL <= d; k += VL) s0 += vloadf(a + k) * vloadf(b + k);
    float s = hsum((s0 + s1) + (s2 + s3));
    for (; k < d; k++) s += a[k] * b[k];
    return s;
}

#ifdef STREAM_BF16
typedef uint16_t vh __attribute__((vector_size(VL * sizeof(uint16_t))));
typedef uint32_t vu __attribute__((vector_size(VL * sizeof(uint32_t))));

static inline vf vld(const stream_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void vst(stream_t *p, vf f) {
    vu u;
    memcpy(&u, &f, sizeof u);
    vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u); /* all ones where a NaN */
    vh h = __builtin_convertvector((rounded & ~nan) | (0x7fc0u & nan), vh);
    memcpy(p, &h, sizeof h);
}
#else
static inline vf vld(const stream_t *p) { return vloadf(p); }
static inline void vst(stream_t *p, vf v) { vstoref(p, v); }
#endif

/* the count values at src as float32: src itself for float streams, else widened into buf (a token's streams
   at a time, so that each value is widened once however often it is used) */
static inline const float *widen(const stream_t *src, int count, float *buf) {
#ifdef STREAM_BF16
    int k = 0;
    for (; k + VL <= count; k += VL) vstoref(buf + k, vld(src + k));
    for (; k < count; k++) buf[k] = ld(src[k]);
    return buf;
#else
    (void)count;
    (void)buf;
    return src;
#endif
}

/* the count floats at src into dst of the streams' type, rounded */
static inline void narrow(const float *src, int count, stream_t *dst) {
    int k = 0;
    for (; k + VL <= count; k += VL) vst(dst + k, vloadf(src + k));
    for (; k < count; k++) dst[k] = st(src[k]);
}

/* a buffer of count floats for widen(), or NULL where the streams are float already */
static float *widen_buffer(int64_t count) {
#ifdef STREAM_BF16
    float *buf = malloc(sizeof(float) * (size_t)count);
    if (!buf) abort();
    return buf;
#else
    (void)count;
    return NULL;
#endif
}

typedef void (*range_fn)(const void *args, int64_t lo, int64_t hi);

struct job {
    range_fn fn;
    const void *args;
    int64_t lo, hi;
};

static void *run_job(void *p) {
    struct job *j = p;
    j->fn(j->args, j->lo, j->hi);
    return NULL;
}

#define MAX_THREADS 64

static void parallel_for(int64_t T, int threads, range_fn fn, const void *args) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > T / 16) threads = (int)(T / 16); /* a thread costs tens of microseconds: not for a few tokens */
    if (threads < 2) {
        fn(args, 0, T);
        return;
    }
    struct job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS];
    int64_t chunk = (T + threads - 1) / threads;
    for (int k = 0; k < threads; k++) {
        jobs[k].fn = fn;
        jobs[k].args = args;
        jobs[k].lo = k * chunk < T ? k * chunk : T;
        jobs[k].hi = (k + 1) * chunk < T ? (k + 1) * chunk : T;
        started[k] = k > 0 && pthread_create(&tid[k], NULL, run_job, &jobs[k]) == 0;
    }
    for (int k = 0; k < threads; k++)
        if (!started[k]) run_job(&jobs[k]); /* this thread's share, and any a thread could not be made for */
    for (int k = 1; k < threads; k++)
        if (started[k]) pthread_join(tid[k], NULL);
}

/* ---- Sinkhorn-Knopp: rows then columns, `iters` rounds, of exp(logits - max), per token ----
   Tokens go through in blocks of LANES, element-major within a block (m[e * LANES + lane]), so that every
   step is a vector operation across the block's tokens. */

#define LANES 16

struct sinkhorn_args {
    int n, iters;
    float floor;
    const float *logits, *grad;
    float *out, *sums, *grad_logits; /* sums: each token's 2 * iters * n divisors, (T, 2 * iters, n) */
};

/* the block's tokens t0 .. t0+cnt-1 of src (T, nn) into dst[e * LANES + lane]; lanes past cnt get zeros */
static void gather(const float *src, int64_t t0, int cnt, int nn, float *dst) {
    for (int e = 0; e < nn; e++)
        for (int l = 0; l < LANES; l++) dst[e * LANES + l] = l < cnt ? src[(t0 + l) * nn + e] : 0.0f;
}

static void scatter(const float *src, int64_t t0, int cnt, int nn, float *dst) {
    for (int l = 0; l < cnt; l++)
        for (int e = 0; e < nn; e++) dst[(t0 + l) * nn + e] = src[e * LANES + l];
}

/* z (logits) -> m = exp(max(z - max z, floor)) in place; top gets each lane's max */
static void sinkhorn_start(int nn, float floor, float *z, float *top) {
    for (int l = 0; l < LANES; l++) top[l] = z[l];
    for (int e = 1; e < nn; e++)
        for (int l = 0; l < LANES; l++) top[l] = z[e * LANES + l] > top[l] ? z[e * LANES + l] : top[l];
    for (int e = 0; e < nn; e++)
        for (int l = 0; l < LANES; l++) {
            float v = z[e * LANES + l] - top[l];
            z[e * LANES + l] = expf(v < floor ? floor : v);
        }
}

/* one division of m by its sums over a row (stride 1, step n between rows) or a column (stride n, step 1);
   the sums go to sums[k * n * LANES ...] when sums is not NULL */
static void normalise(int n, float *m, int stride, int step, float *sums) {
    for (int a = 0; a < n; a++) {
        float s[LANES];
        for (int l = 0; l < LANES; l++) s[l] = 0.0f;
        for (int b = 0; b < n; b++)
            for (int l = 0; l < LANES; l++) s[l] += m[(a * step + b * stride) * LANES + l];
        for (int b = 0; b < n; b++)
            for (int l = 0; l < LANES; l++) m[(a * step + b * stride) * LANES + l] /= s[l];
        if (sums)
            for (int l = 0; l < LANES; l++) sums[a * LANES + l] = s[l];
    }
}

/* back through one division (same layout): g = (g - sum(g m')) / s, then m = m' s */
static void unnormalise(int n, float *m, float *g, int stride, int step, const float *sums) {
    for (int a = 0; a < n; a++) {
        float dot[LANES];
        const float *s = sums + a * LANES;
        for (int l = 0; l < LANES; l++) dot[l] = 0.0f;
        for (int b = 0; b < n; b++)
            for (int l = 0; l < LANES; l++) dot[l] += g[(a * step + b * stride) * LANES + l] * m[(a * step + b * stride) * LANES + l];
        for (int b = 0; b < n; b++)
            for (int l = 0; l < LANES; l++) {
                int e = (a * step + b * stride) * LANES + l;
                g[e] = (g[e] - dot[l]) / s[l];
                m[e] *= s[l];
            }
    }
}

static void sinkhorn_fwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct sinkhorn_args *a = p;
    int n = a->n, nn = n * n, ns = 2 * a->iters * n;
    float *m = malloc(sizeof(float) * (size_t)(nn + ns) * LANES), top[LANES];
    if (!m) abort();
    float *sums = m + (size_t)nn * LANES;
    for (int64_t t0 = lo; t0 < hi; t0 += LANES) {
        int cnt = hi - t0 < LANES ? (int)(hi - t0) : LANES;
        gather(a->logits, t0, cnt, nn, m);
        sinkhorn_start(nn, a->floor, m, top);
        for (int r = 0; r < a->iters; r++) {
            normalise(n, m, 1, n, sums + (size_t)(2 * r) * n * LANES);     /* rows */
            normalise(n, m, n, 1, sums + (size_t)(2 * r + 1) * n * LANES); /* columns */
        }
        scatter(m, t0, cnt, nn, a->out);
        scatter(sums, t0, cnt, ns, a->sums);
    }
    free(m);
}

/* Back through each division m' = m / s (s summed over a row or a column): dL/dm = (dL/dm' - sum(dL/dm' m')) / s,
   then m = m' s, from the result and the forward's divisors; at the start m = exp(z - max z), so
   dL/dz = dL/dm m (the shift changes nothing; below the floor the clamp passes no gradient). */
static void sinkhorn_bwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct sinkhorn_args *a = p;
    int n = a->n, nn = n * n, ns = 2 * a->iters * n;
    size_t per = (size_t)nn * LANES;
    float *buf = malloc(sizeof(float) * (3 * per + (size_t)ns * LANES)), top[LANES];
    if (!buf) abort();
    float *m = buf, *g = buf + per, *z = buf + 2 * per, *sums = buf + 3 * per;
    for (int64_t t0 = lo; t0 < hi; t0 += LANES) {
        int cnt = hi - t0 < LANES ? (int)(hi - t0) : LANES;
        gather(a->logits, t0, cnt, nn, z);
        for (int l = 0; l < LANES; l++) top[l] = z[l];
        for (int e = 1; e < nn; e++)
            for (int l = 0; l < LANES; l++) top[l] = z[e * LANES + l] > top[l] ? z[e * LANES + l] : top[l];
        gather(a->out, t0, cnt, nn, m);
        gather(a->sums, t0, cnt, ns, sums);
        gather(a->grad, t0, cnt, nn, g);
        for (int r = a->iters - 1; r >= 0; r--) {
            unnormalise(n, m, g, n, 1, sums + (size_t)(2 * r + 1) * n * LANES);
            unnormalise(n, m, g, 1, n, sums + (size_t)(2 * r) * n * LANES);
        }
        for (int e = 0; e < nn; e++)
            for (int l = 0; l < LANES; l++)
                g[e * LANES + l] = z[e * LANES + l] - top[l] < a->floor ? 0.0f : g[e * LANES + l] * m[e * LANES + l];
        scatter(g, t0, cnt, nn, a->grad_logits);
    }
    free(buf);
}

void mhc_sinkhorn_forward(int64_t T, int n, int iters, float floor, const float *logits, float *out, float *sums,
                          int threads) {
    struct sinkhorn_args a = {n, iters, floor, logits, NULL, out, sums, NULL};
    parallel_for(T, threads, sinkhorn_fwd_range, &a);
}

void mhc_sinkhorn_backward(int64_t T, int n, int iters, float floor, const float *logits, const float *out,
                           const float *sums, const float *grad, float *grad_logits, int threads) {
    struct sinkhorn_args a = {n, iters, floor, logits, grad, (float *)out, (float *)sums, grad_logits};
    parallel_for(T, threads, sinkhorn_bwd_range, &a);
}

/* out = sum_j w_j rows_j: n rows of d floats, one after the other */
static inline void combine(const float *w, const float *rows, int n, int d, float *out) {
    int k = 0;
    for (; k + VL <= d; k += VL) {
        vf v = w[0] * vloadf(rows + k);
        for (int j = 1; j < n; j++) v += w[j] * vloadf(rows + j * d + k);
        vstoref(out + k, v);
    }
    for (; k < d; k++) {
        float v = w[0] * rows[k];
        for (int j = 1; j < n; j++) v += w[j] * rows[j * d + k];
        out[k] = v;
    }
}

/* ---- the projection's per-token part and the read. In: z = x W^T (flattened streams, unscaled). Out: z times
   the RMS scale of the token's streams, scale = (mean(x^2) + 1e-6)^-1/2, pre = sigmoid(gate z_pre + bias) and
   inp = sum_j pre_j x_j; one pass over the streams ---- */

struct project_args {
    int n, d, m;
    float gate;
    const float *bias;
    const stream_t *x;
    float *z, *scale, *pre, *inp;
};

static void project_range(const void *p, int64_t lo, int64_t hi) {
    const struct project_args *a = p;
    int n = a->n, d = a->d, m = a->m, nd = n * d;
    float *buf = widen_buffer(nd);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = widen(a->x + t * nd, nd, buf);
        float s = 1.0f / sqrtf(dot(x, x, nd) / (float)nd + 1e-6f);
        float *z = a->z + t * m, *pre = a->pre + t * n, *o = a->inp + t * d;
        for (int c = 0; c < m; c++) z[c] *= s;
        a->scale[t] = s;
        for (int j = 0; j < n; j++) pre[j] = 1.0f / (1.0f + expf(-(a->gate * z[j] + a->bias[j])));
        combine(pre, x, n, d, o);
    }
    free(buf);
}

void mhc_project_read(int64_t T, int n, int d, int m, float gate, const float *bias, const stream_t *x, float *z,
                      float *scale, float *pre, float *inp, int threads) {
    struct project_args a = {n, d, m, gate, bias, x, z, scale, pre, inp};
    parallel_for(T, threads, project_range, &a);
}

/* ---- the read's transpose, the per stream dot products out_j = x_j . g (dL/dpre from dL/dinp) ---- */

struct dots_args {
    int n, d;
    const stream_t *x;
    const float *g;
    float *out;
};

static void dots_range(const void *p, int64_t lo, int64_t hi) {
    const struct dots_args *a = p;
    int n = a->n, d = a->d;
    float *buf = widen_buffer(n * d);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = widen(a->x + t * n * d, n * d, buf);
        for (int j = 0; j < n; j++) a->out[t * n + j] = dot(x + j * d, a->g + t * d, d);
    }
    free(buf);
}

void mhc_stream_dots(int64_t T, int n, int d, const stream_t *x, const float *g, float *out, int threads) {
    struct dots_args a = {n, d, x, g, out};
    parallel_for(T, threads, dots_range, &a);
}

/* ---- dL/dx, every part of it in one pass: through the write (sum_i res_ij grad_i; grad NULL where the write
   reached no loss), the read (pre_j g_inp), the RMS scale (c x_j) and the projection (coef W, coef = dL/dz
   times the scale): gx_j = sum_i res_ij grad_i + pre_j g_inp + c x_j + sum_q coef_q W_q,j ---- */

struct grad_x_args {
    int n, d, m;
    const stream_t *grad, *x;
    const float *res, *pre, *g_inp, *c, *coef, *W;
    stream_t *gx;
};

/* features k0 .. k0 + nv*VL of dL/dx_j for the tokens t .. t + nt - 1 (x[u], grad[u]: token t+u's streams as
   floats, grad NULL for none; out: each token's dL/dx_j, d apart). nv (4 or 1) and nt (2 or 1) are constants
   once inlined, so that the nt*nv sums are registers while W's m rows stream by, each row loaded once for both
   tokens. Each token's sums are its own, in the same order however the tokens are paired. */
static inline __attribute__((always_inline)) void grad_x_span(const struct grad_x_args *a, int64_t t, int j, int k0,
                                                              const float *const *x, const float *const *grad,
                                                              float *out, const int nv, const int nt) {
    int n = a->n, d = a->d, m = a->m, nd = n * d;
    vf acc[2][4];
#pragma GCC unroll 2
    for (int u = 0; u < nt; u++) {
        const float *g = a->g_inp + (t + u) * d + k0;
        float w = a->pre[(t + u) * n + j], c = a->c[t + u];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[u][v] = w * vloadf(g + v * VL) + c * vloadf(x[u] + j * d + k0 + v * VL);
        if (grad)
            for (int i = 0; i < n; i++) {
                float r = a->res[((t + u) * n + i) * n + j];
#pragma GCC unroll 4
                for (int v = 0; v < nv; v++) acc[u][v] += r * vloadf(grad[u] + i * d + k0 + v * VL);
            }
    }
    for (int q = 0; q < m; q++) {
        const float *wq = a->W + (int64_t)q * nd + j * d + k0;
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            vf wv = vloadf(wq + v * VL);
#pragma GCC unroll 2
            for (int u = 0; u < nt; u++) acc[u][v] += a->coef[(t + u) * m + q] * wv;
        }
    }
#pragma GCC unroll 2
    for (int u = 0; u < nt; u++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) vstoref(out + u * d + k0 + v * VL, acc[u][v]);
}

/* dL/dx of the tokens t .. t + nt - 1, their streams widened into buf */
static inline __attribute__((always_inline)) void grad_x_tokens(const struct grad_x_args *a, int64_t t, float *buf,
                                                                const int nt) {
    int n = a->n, d = a->d, m = a->m, nd = n * d;
    float *out = buf + 4 * nd;
    const float *x[2], *grad[2];
    for (int u = 0; u < nt; u++) {
        x[u] = widen(a->x + (t + u) * nd, nd, buf + u * nd);
        grad[u] = a->grad ? widen(a->grad + (t + u) * nd, nd, buf + (2 + u) * nd) : NULL;
    }
    const float *const *g = a->grad ? grad : NULL;
    for (int j = 0; j < n; j++) {
        int k = 0;
        for (; k + 4 * VL <= d; k += 4 * VL) grad_x_span(a, t, j, k, x, g, out, 4, nt);
        for (; k + VL <= d; k += VL) grad_x_span(a, t, j, k, x, g, out, 1, nt);
        for (int u = 0; u < nt; u++) {
            int64_t tu = t + u;
            for (int kk = k; kk < d; kk++) { /* the last d % VL features */
                float v = a->pre[tu * n + j] * a->g_inp[tu * d + kk] + a->c[tu] * x[u][j * d + kk];
                if (g)
                    for (int i = 0; i < n; i++) v += a->res[(tu * n + i) * n + j] * g[u][i * d + kk];
                for (int q = 0; q < m; q++) v += a->coef[tu * m + q] * a->W[(int64_t)q * nd + j * d + kk];
                out[u * d + kk] = v;
            }
            narrow(out + u * d, d, a->gx + (tu * n + j) * d);
        }
    }
}

static void grad_x_range(const void *p, int64_t lo, int64_t hi) {
    const struct grad_x_args *a = p;
    int nd = a->n * a->d;
    float *buf = malloc(sizeof(float) * (size_t)(4 * nd + 2 * a->d)); /* two tokens' x, grad, and dL/dx_j */
    if (!buf) abort();
    int64_t t = lo;
    for (; t + 2 <= hi; t += 2) grad_x_tokens(a, t, buf, 2);
    if (t < hi) grad_x_tokens(a, t, buf, 1);
    free(buf);
}

void mhc_grad_x(int64_t T, int n, int d, int m, const stream_t *grad, const float *res, const float *pre,
                const float *g_inp, const float *c, const float *coef, const float *W, const stream_t *x,
                stream_t *gx, int threads) {
    struct grad_x_args a = {n, d, m, grad, x, res, pre, g_inp, c, coef, W, gx};
    parallel_for(T, threads, grad_x_range, &a);
}

/* ---- the new streams: out_i = sum_j res_ij x_j + post_i f ---- */

struct write_args {
    int n, d;
    const float *res, *post;
    const stream_t *x, *f, *grad;
    stream_t *out, *g_f;
    float *g_res, *g_post;
};

static void write_fwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct write_args *a = p;
    int n = a->n, d = a->d, nd = n * d;
    float *buf = malloc(sizeof(float) * (size_t)(nd + 2 * d)); /* the token's x, f (widened) and out_i */
    if (!buf) abort();
    for (int64_t t = lo; t < hi; t++) {
        const float *x = widen(a->x + t * nd, nd, buf), *f = widen(a->f + t * d, d, buf + nd);
        const float *res = a->res + t * n * n;
        float *o = buf + nd + d;
        for (int i = 0; i < n; i++) {
            float w = a->post[t * n + i];
            int k = 0;
            for (; k + VL <= d; k += VL) {
                vf v = w * vloadf(f + k);
                for (int j = 0; j < n; j++) v += res[i * n + j] * vloadf(x + j * d + k);
                vstoref(o + k, v);
            }
            for (; k < d; k++) {
                float v = w * f[k];
                for (int j = 0; j < n; j++) v += res[i * n + j] * x[j * d + k];
                o[k] = v;
            }
            narrow(o, d, a->out + (t * n + i) * d);
        }
    }
    free(buf);
}

void mhc_write_forward(int64_t T, int n, int d, const float *res, const stream_t *x, const float *post,
                       const stream_t *f, stream_t *out, int threads) {
    struct write_args a = {n, d, res, post, x, f, NULL, out, NULL, NULL, NULL};
    parallel_for(T, threads, write_fwd_range, &a);
}

/* g_res_ij = grad_i . x_j; g_post_i = grad_i . f; g_f = sum_i post_i grad_i (dL/dx is mhc_grad_x's) */
static void write_bwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct write_args *a = p;
    int n = a->n, d = a->d, nd = n * d;
    float *buf = malloc(sizeof(float) * (size_t)(2 * nd + 2 * d)); /* the token's x, grad, f and g_f */
    if (!buf) abort();
    for (int64_t t = lo; t < hi; t++) {
        const float *x = widen(a->x + t * nd, nd, buf), *grad = widen(a->grad + t * nd, nd, buf + nd);
        const float *f = widen(a->f + t * d, d, buf + 2 * nd), *post = a->post + t * n;
        float *gf = buf + 2 * nd + d;
        combine(post, grad, n, d, gf);
        narrow(gf, d, a->g_f + t * d);
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) a->g_res[(t * n + i) * n + j] = dot(grad + i * d, x + j * d, d);
            a->g_post[t * n + i] = dot(grad + i * d, f, d);
        }
    }
    free(buf);
}

void mhc_write_backward(int64_t T, int n, int d, const stream_t *grad, const float *res, const stream_t *x,
                        const float *post, const stream_t *f, float *g_res, float *g_post, stream_t *g_f,
                        int threads) {
    struct write_args a = {n, d, res, post, x, f, grad, NULL, g_f, g_res, g_post};
    parallel_for(T, threads, write_bwd_range, &a);
}
