/* Fused CPU loops for the mHC connections (auralm/models/mhc.py), every tensor contiguous.

   Eager PyTorch runs each step of a connection as its own pass over the n streams of every token (and its
   batched matrix products over 4x4 matrices loop over the tokens one small call at a time); here each
   function is one pass over the tokens, with a token's streams in the first-level cache while they are
   used. Tokens are split over `threads` POSIX threads in whole blocks of 16; every token is computed by one
   thread in the same order whatever the split, so the results do not depend on the number of threads.

   The streams (x, their gradient, the new streams, and the sublayer's output f that is written into them) are
   of type `stream_t`: float, or with STREAM_BF16 defined bfloat16 (what the paper's kernels keep them in under
   bf16 training), loaded to float32 for every sum and rounded to the nearest even bfloat16 once, when stored.
   Everything else is float32: the coefficients, what the sublayer reads (inp) and its gradient.

   Shapes: T tokens, n streams, d features, m = 2n + n*n coefficients.
   x, grad, out, gx: (T, n, d); f, inp, g_inp: (T, d); scale: (T); pre, post: (T, n); res: (T, n, n);
   z, G, coef: (T, m); W: (m, n*d); sums: (ceil(T / 16), 2 * iters * n, 16). */

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
    chunk = (chunk + 15) / 16 * 16; /* whole blocks of 16 tokens (LANES) */
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

/* ---- Sinkhorn-Knopp: rows then columns, `iters` rounds, of exp(logits - max), per token ----
   Tokens go through in blocks of LANES (= VL), element-major within a block (element e of the block's token l at
   [e * LANES + l]), so that every step is one vector operation across the block's tokens, the block's matrices
   in registers. A block's divisors are kept for the backward pass, (2 * iters * n, LANES) a block. */

#define LANES VL
#define MAX_N 8 /* the connections with more streams take the PyTorch path (MAX_FUSED_FLOWS in mhc.py) */

/* the block's tokens t0 .. t0+cnt-1 of src (T, nn) into dst[e * LANES + lane]; lanes past cnt get zeros */
static void gather(const float *src, int64_t t0, int cnt, int nn, float *dst) {
    for (int e = 0; e < nn; e++)
        for (int l = 0; l < LANES; l++) dst[e * LANES + l] = l < cnt ? src[(t0 + l) * nn + e] : 0.0f;
}

static void scatter(const float *src, int64_t t0, int cnt, int nn, float *dst) {
    for (int l = 0; l < cnt; l++)
        for (int e = 0; e < nn; e++) dst[(t0 + l) * nn + e] = src[e * LANES + l];
}

/* each lane's largest logit (a shift of all of a matrix's logits leaves its result as it is) */
static void lane_max(int nn, const float *z, float *top) {
    for (int l = 0; l < LANES; l++) top[l] = z[l];
    for (int e = 1; e < nn; e++)
        for (int l = 0; l < LANES; l++) top[l] = z[e * LANES + l] > top[l] ? z[e * LANES + l] : top[l];
}

/* element (a, b) of a row (row != 0: a-th row, b-th column) or of a column (a-th column, b-th row) */
#define AT(n, row, a, b) ((row) ? (a) * (n) + (b) : (b) * (n) + (a))

/* the block's matrices (logits in z) -> doubly stochastic, in z; sums gets every division's divisors */
static inline __attribute__((always_inline)) void sinkhorn_block(const int n, int iters, float floor, float *z,
                                                                  float *sums) {
    float top[LANES];
    lane_max(n * n, z, top);
    for (int e = 0; e < n * n; e++)
        for (int l = 0; l < LANES; l++) {
            float v = z[e * LANES + l] - top[l];
            z[e * LANES + l] = expf(v < floor ? floor : v);
        }
    vf m[MAX_N * MAX_N];
    for (int e = 0; e < n * n; e++) m[e] = vloadf(z + e * LANES);
    for (int r = 0; r < iters; r++)
        for (int row = 1; row >= 0; row--)
            for (int a = 0; a < n; a++) {
                vf s = m[AT(n, row, a, 0)];
                for (int b = 1; b < n; b++) s += m[AT(n, row, a, b)];
                vf q = 1.0f / s;
                for (int b = 0; b < n; b++) m[AT(n, row, a, b)] *= q;
                vstoref(sums, s);
                sums += LANES;
            }
    for (int e = 0; e < n * n; e++) vstoref(z + e * LANES, m[e]);
}

/* back through the rounds: each division m' = m / s (s summed over a row or a column) from the result and its
   divisors, dL/dm = (dL/dm' - sum(dL/dm' m')) / s, then m = m' s; at the start m = exp(z - max z), so
   dL/dz = dL/dm m (the shift changes nothing; below the floor the clamp passes no gradient).
   In: z the logits, out the result, g dL/dout; out: g = dL/dz. */
static inline __attribute__((always_inline)) void sinkhorn_block_back(const int n, int iters, float floor,
                                                                       const float *z, const float *out,
                                                                       const float *sums, float *g) {
    vf m[MAX_N * MAX_N], gv[MAX_N * MAX_N];
    for (int e = 0; e < n * n; e++) m[e] = vloadf(out + e * LANES), gv[e] = vloadf(g + e * LANES);
    sums += (size_t)2 * iters * n * LANES;
    for (int r = iters - 1; r >= 0; r--)
        for (int row = 0; row <= 1; row++)
            for (int a = n - 1; a >= 0; a--) {
                sums -= LANES;
                vf s = vloadf(sums), q = 1.0f / s, dot = gv[AT(n, row, a, 0)] * m[AT(n, row, a, 0)];
                for (int b = 1; b < n; b++) dot += gv[AT(n, row, a, b)] * m[AT(n, row, a, b)];
                for (int b = 0; b < n; b++) {
                    int e = AT(n, row, a, b);
                    gv[e] = (gv[e] - dot) * q;
                    m[e] *= s;
                }
            }
    for (int e = 0; e < n * n; e++) vstoref(g + e * LANES, gv[e] * m[e]);
    float top[LANES];
    lane_max(n * n, z, top);
    for (int e = 0; e < n * n; e++)
        for (int l = 0; l < LANES; l++)
            if (z[e * LANES + l] - top[l] < floor) g[e * LANES + l] = 0.0f;
}

/* ---- a connection's coefficients and its read, forward and backward ----
   Forward, per token: the RMS scale of the flattened streams, s = (mean(x^2) + 1e-6)^-1/2, applied to z = x W^T
   (made before, by BLAS); u = gate * z + bias, each part with its own gate; H_pre = sigmoid(u_pre), H_post =
   2 sigmoid(u_post), H_res = Sinkhorn(u_res) (a block of tokens at a time); and what the sublayer reads,
   inp = sum_j pre_j x_j. One pass over the streams.
   Backward, per token: dL/du (G) from dL/dinp, dL/dH_post and dL/dH_res; dL/dz = gate * G and coef = dL/dz s
   (for dL/dW = coef^T x, by BLAS after); and dL/dx whole in the same pass: through the write that follows the
   sublayer (sum_i res_ij grad_i; grad NULL where the write reached no loss), the read (pre_j dL/dinp), the scale
   (c x_j, c = (dL/dz . z) s^2 / -nd) and the projection (coef W). */

struct coef_args {
    int n, d, m, iters;
    float floor;
    const float *gate, *bias; /* gate: pre, post, res; bias: m (pre n, post n, res n*n) */
    const stream_t *x, *grad, *f;
    const float *W, *g_inp, *g_post, *g_res;
    float *z, *scale, *pre, *post, *res, *sums, *inp, *G, *coef;
    stream_t *gx;
};

static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/* H_res's logit e of the token whose (scaled) z is given: the forward makes it, the backward again, the same bits */
static inline float res_logit(const struct coef_args *a, const float *z, int n, int e) {
    return a->gate[2] * z[2 * n + e] + a->bias[2 * n + e];
}

/* the divisors Sinkhorn kept for the block that starts at token t0 */
static inline float *block_sums(const struct coef_args *a, int64_t t0) {
    return a->sums + (t0 / LANES) * 2 * a->iters * a->n * LANES;
}

static inline __attribute__((always_inline)) void coef_fwd_block(const struct coef_args *a, int64_t t0, int cnt,
                                                                 float *buf, const int n) {
    int d = a->d, m = a->m, nd = n * d, nn = n * n;
    float lg[MAX_N * MAX_N * LANES];
    memset(lg, 0, sizeof(float) * (size_t)(nn * LANES)); /* lanes past cnt: zeros */
    for (int l = 0; l < cnt; l++) {
        int64_t t = t0 + l;
        const float *x = widen(a->x + t * nd, nd, buf);
        float s = 1.0f / sqrtf(dot(x, x, nd) / (float)nd + 1e-6f);
        float *z = a->z + t * m, *pre = a->pre + t * n, *post = a->post + t * n;
        for (int c = 0; c < m; c++) z[c] *= s;
        a->scale[t] = s;
        for (int j = 0; j < n; j++) {
            pre[j] = sigmoid(a->gate[0] * z[j] + a->bias[j]);
            post[j] = 2.0f * sigmoid(a->gate[1] * z[n + j] + a->bias[n + j]);
        }
        for (int e = 0; e < nn; e++) lg[e * LANES + l] = res_logit(a, z, n, e);
        combine(pre, x, n, d, a->inp + t * d);
    }
    sinkhorn_block(n, a->iters, a->floor, lg, block_sums(a, t0));
    scatter(lg, t0, cnt, nn, a->res);
}

static void coef_fwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct coef_args *a = p;
    float *buf = widen_buffer(a->n * a->d);
    for (int64_t t0 = lo; t0 < hi; t0 += LANES) {
        int cnt = hi - t0 < LANES ? (int)(hi - t0) : LANES;
        if (a->n == 4)
            coef_fwd_block(a, t0, cnt, buf, 4); /* the default, with every loop over the streams unrolled */
        else
            coef_fwd_block(a, t0, cnt, buf, a->n);
    }
    free(buf);
}

void mhc_coefficients_forward(int64_t T, int n, int d, int m, int iters, float floor, const float *gate,
                              const float *bias, const stream_t *x, float *z, float *scale, float *pre, float *post,
                              float *res, float *sums, float *inp, int threads) {
    struct coef_args a = {n, d, m, iters, floor, gate, bias, x, NULL, NULL, NULL, NULL, NULL, NULL,
                          z, scale, pre, post, res, sums, inp, NULL, NULL, NULL};
    parallel_for(T, threads, coef_fwd_range, &a);
}

/* features k0 .. k0 + nv*VL of dL/dx_j for the tokens t .. t + nt - 1 (c[u], coef + u*m: token t+u's scale part
   and dL/dz times the scale). nv (4 or 1) and nt (2 or 1) are constants once inlined, so that the nt*nv sums are
   registers while W's m rows stream by, each row loaded once for both tokens; the block's tokens go by for one
   span of W before the next, so that the span (m * nv * VL floats) stays in the first-level cache. Each token's
   sums are its own, in the same order however the tokens are paired. */
static inline __attribute__((always_inline)) void grad_x_span(const struct coef_args *a, int64_t t, int j, int k0,
                                                              const float *c, const float *coef, const int nv,
                                                              const int nt) {
    int n = a->n, d = a->d, m = a->m, nd = n * d;
    vf acc[2][4];
#pragma GCC unroll 2
    for (int u = 0; u < nt; u++) {
        int64_t tu = t + u;
        const float *g = a->g_inp + tu * d + k0;
        const stream_t *x = a->x + tu * nd + j * d + k0;
        float w = a->pre[tu * n + j];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[u][v] = w * vloadf(g + v * VL) + c[u] * vld(x + v * VL);
        if (a->grad)
            for (int i = 0; i < n; i++) {
                float r = a->res[(tu * n + i) * n + j];
                const stream_t *gi = a->grad + tu * nd + i * d + k0;
#pragma GCC unroll 4
                for (int v = 0; v < nv; v++) acc[u][v] += r * vld(gi + v * VL);
            }
    }
    for (int q = 0; q < m; q++) {
        const float *wq = a->W + (int64_t)q * nd + j * d + k0;
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            vf wv = vloadf(wq + v * VL);
#pragma GCC unroll 2
            for (int u = 0; u < nt; u++) acc[u][v] += coef[u * m + q] * wv;
        }
    }
#pragma GCC unroll 2
    for (int u = 0; u < nt; u++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) vst(a->gx + (t + u) * nd + j * d + k0 + v * VL, acc[u][v]);
}

/* the features from k0 on (fewer than VL) of dL/dx_j of token t, as grad_x_span's sums */
static void grad_x_tail(const struct coef_args *a, int64_t t, int j, int k0, float c, const float *coef) {
    int n = a->n, d = a->d, m = a->m, nd = n * d;
    for (int k = k0; k < d; k++) {
        float v = a->pre[t * n + j] * a->g_inp[t * d + k] + c * ld(a->x[t * nd + j * d + k]);
        if (a->grad)
            for (int i = 0; i < n; i++) v += a->res[(t * n + i) * n + j] * ld(a->grad[t * nd + i * d + k]);
        for (int q = 0; q < m; q++) v += coef[q] * a->W[(int64_t)q * nd + j * d + k];
        a->gx[t * nd + j * d + k] = st(v);
    }
}

/* dL/dx of the block's tokens, over the features in spans of nv vectors from k0 on; returns where it stopped */
static inline __attribute__((always_inline)) int grad_x_spans(const struct coef_args *a, int64_t t0, int cnt, int j,
                                                               int k, const float *c, const float *coef,
                                                               const int nv) {
    int m = a->m;
    for (; k + nv * VL <= a->d; k += nv * VL) {
        int l = 0;
        for (; l + 2 <= cnt; l += 2) grad_x_span(a, t0 + l, j, k, c + l, coef + l * m, nv, 2);
        if (l < cnt) grad_x_span(a, t0 + l, j, k, c + l, coef + l * m, nv, 1);
    }
    return k;
}

static inline __attribute__((always_inline)) void coef_bwd_block(const struct coef_args *a, int64_t t0, int cnt,
                                                                 float *buf, const int n) {
    int d = a->d, m = a->m, nd = n * d, nn = n * n;
    float lg[MAX_N * MAX_N * LANES], out[MAX_N * MAX_N * LANES], g[MAX_N * MAX_N * LANES];
    memset(lg, 0, sizeof(float) * (size_t)(nn * LANES)); /* lanes past cnt: zeros */
    memset(g, 0, sizeof(float) * (size_t)(nn * LANES));
    for (int l = 0; l < cnt; l++) /* the logits again, as the forward made them */
        for (int e = 0; e < nn; e++) lg[e * LANES + l] = res_logit(a, a->z + (t0 + l) * m, n, e);
    gather(a->res, t0, cnt, nn, out);
    /* dL/dH_res and dL/dH_post through the write, grad_i . x_j and grad_i . f, and dL/dH_pre, x_j . dL/dinp,
       each token's streams widened once (plus any other path's gradients of them, where given) */
    float gp[LANES * MAX_N] = {0}, gpre[LANES * MAX_N];
    for (int l = 0; l < cnt; l++) {
        int64_t t = t0 + l;
        const float *x = widen(a->x + t * nd, nd, buf);
        for (int j = 0; j < n; j++) gpre[l * n + j] = dot(x + j * d, a->g_inp + t * d, d);
        if (a->grad) {
            const float *grad = widen(a->grad + t * nd, nd, buf + nd), *f = widen(a->f + t * d, d, buf + 2 * nd);
            for (int i = 0; i < n; i++) {
                for (int j = 0; j < n; j++) g[(i * n + j) * LANES + l] = dot(grad + i * d, x + j * d, d);
                gp[l * n + i] = dot(grad + i * d, f, d);
            }
        }
        if (a->g_res)
            for (int e = 0; e < nn; e++) g[e * LANES + l] += a->g_res[t * nn + e];
        if (a->g_post)
            for (int i = 0; i < n; i++) gp[l * n + i] += a->g_post[t * n + i];
    }
    sinkhorn_block_back(n, a->iters, a->floor, lg, out, block_sums(a, t0), g);
    float c[LANES];
    for (int l = 0; l < cnt; l++) {
        int64_t t = t0 + l;
        const float *pre = a->pre + t * n, *post = a->post + t * n, *z = a->z + t * m;
        float *G = a->G + t * m, *coef = a->coef + t * m, s = a->scale[t];
        for (int j = 0; j < n; j++) {
            G[j] = gpre[l * n + j] * pre[j] * (1.0f - pre[j]);             /* sigmoid' */
            G[n + j] = gp[l * n + j] * post[j] * (1.0f - 0.5f * post[j]); /* 2 sigmoid' */
        }
        for (int e = 0; e < nn; e++) G[2 * n + e] = g[e * LANES + l];
        float gz = 0.0f;
        for (int q = 0; q < m; q++) {
            float gq = a->gate[q < n ? 0 : q < 2 * n ? 1 : 2] * G[q];
            gz += gq * z[q];
            coef[q] = gq * s;
        }
        c[l] = gz * s * s / -(float)nd;
    }
    const float *coef = a->coef + t0 * m;
    for (int j = 0; j < n; j++) {
        int k = grad_x_spans(a, t0, cnt, j, 0, c, coef, 4);
        k = grad_x_spans(a, t0, cnt, j, k, c, coef, 1);
        if (k < d)
            for (int l = 0; l < cnt; l++) grad_x_tail(a, t0 + l, j, k, c[l], coef + l * m);
    }
}

static void coef_bwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct coef_args *a = p;
    int nd = a->n * a->d;
    float *buf = malloc(sizeof(float) * (size_t)(2 * nd + a->d)); /* a token's x, grad and f, widened */
    if (!buf) abort();
    for (int64_t t0 = lo; t0 < hi; t0 += LANES) {
        int cnt = hi - t0 < LANES ? (int)(hi - t0) : LANES;
        if (a->n == 4)
            coef_bwd_block(a, t0, cnt, buf, 4); /* the default, with every loop over the streams unrolled */
        else
            coef_bwd_block(a, t0, cnt, buf, a->n);
    }
    free(buf);
}

void mhc_coefficients_backward(int64_t T, int n, int d, int m, int iters, float floor, const float *gate,
                               const float *bias, const stream_t *x, const float *z, const float *scale,
                               const float *pre, const float *post, const float *res, const float *sums,
                               const float *W, const float *g_inp, const float *g_post, const float *g_res,
                               const stream_t *grad, const stream_t *f, float *G, float *coef, stream_t *gx,
                               int threads) {
    struct coef_args a = {n, d, m, iters, floor, gate, bias, x, grad, f, W, g_inp, g_post, g_res,
                          (float *)z, (float *)scale, (float *)pre, (float *)post, (float *)res, (float *)sums,
                          NULL, G, coef, gx};
    parallel_for(T, threads, coef_bwd_range, &a);
}

/* ---- the new streams: out_i = sum_j res_ij x_j + post_i f ---- */

struct write_args {
    int n, d;
    const float *res, *post;
    const stream_t *x, *f, *grad;
    stream_t *out, *g_f;
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
    struct write_args a = {n, d, res, post, x, f, NULL, out, NULL};
    parallel_for(T, threads, write_fwd_range, &a);
}

/* g_f = sum_i post_i grad_i (the gradients of H_res and H_post, and dL/dx, are made by
   mhc_coefficients_backward, in its pass over the streams) */
static void write_bwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct write_args *a = p;
    int n = a->n, d = a->d, nd = n * d;
    float *buf = malloc(sizeof(float) * (size_t)(nd + d)); /* the token's grad (widened) and g_f */
    if (!buf) abort();
    for (int64_t t = lo; t < hi; t++) {
        const float *grad = widen(a->grad + t * nd, nd, buf);
        combine(a->post + t * n, grad, n, d, buf + nd);
        narrow(buf + nd, d, a->g_f + t * d);
    }
    free(buf);
}

void mhc_write_backward(int64_t T, int n, int d, const stream_t *grad, const float *post, stream_t *g_f,
                        int threads) {
    struct write_args a = {n, d, NULL, post, NULL, NULL, grad, NULL, g_f};
    parallel_for(T, threads, write_bwd_range, &a);
}
