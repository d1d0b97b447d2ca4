/* Fused CPU loops for the mHC connections (auralm/models/mhc.py), float32, every tensor contiguous.

   Eager PyTorch runs each step of a connection as its own pass over the n streams of every token (and its
   batched matrix products over 4x4 matrices loop over the tokens one small call at a time); here each
   function is one pass over the tokens, with a token's streams in the first-level cache while they are
   used. Tokens are split over `threads` POSIX threads; every token is computed by one thread in the same
   order whatever the split, so the results do not depend on the number of threads.

   Shapes: T tokens, n streams, d features, m = 2n + n*n coefficients.
   x, grad, out: (T, n, d); f, inp: (T, d); pre, post: (T, n); res, logits: (T, n, n); W: (m, n*d). */

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

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
    float *out, *grad_logits;
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
    int n = a->n, nn = n * n;
    float *m = malloc(sizeof(float) * (size_t)nn * LANES), top[LANES];
    if (!m) abort();
    for (int64_t t0 = lo; t0 < hi; t0 += LANES) {
        int cnt = hi - t0 < LANES ? (int)(hi - t0) : LANES;
        gather(a->logits, t0, cnt, nn, m);
        sinkhorn_start(nn, a->floor, m, top);
        for (int r = 0; r < a->iters; r++) {
            normalise(n, m, 1, n, NULL); /* rows */
            normalise(n, m, n, 1, NULL); /* columns */
        }
        scatter(m, t0, cnt, nn, a->out);
    }
    free(m);
}

/* Back through each division m' = m / s (s summed over a row or a column): dL/dm = (dL/dm' - sum(dL/dm' m')) / s,
   then m = m' s; at the start m = exp(z - max z), so dL/dz = dL/dm m (the shift changes nothing; below the
   floor the clamp passes no gradient). The forward rounds are run again, keeping only their sums. */
static void sinkhorn_bwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct sinkhorn_args *a = p;
    int n = a->n, nn = n * n;
    size_t per = (size_t)nn * LANES;
    float *buf = malloc(sizeof(float) * (3 * per + (size_t)2 * a->iters * n * LANES)), top[LANES];
    if (!buf) abort();
    float *m = buf, *g = buf + per, *z = buf + 2 * per, *sums = buf + 3 * per;
    for (int64_t t0 = lo; t0 < hi; t0 += LANES) {
        int cnt = hi - t0 < LANES ? (int)(hi - t0) : LANES;
        gather(a->logits, t0, cnt, nn, z);
        for (size_t e = 0; e < per; e++) m[e] = z[e];
        sinkhorn_start(nn, a->floor, m, top);
        for (int r = 0; r < a->iters; r++) {
            normalise(n, m, 1, n, sums + (size_t)(2 * r) * n * LANES);
            normalise(n, m, n, 1, sums + (size_t)(2 * r + 1) * n * LANES);
        }
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

void mhc_sinkhorn_forward(int64_t T, int n, int iters, float floor, const float *logits, float *out, int threads) {
    struct sinkhorn_args a = {n, iters, floor, logits, NULL, out, NULL};
    parallel_for(T, threads, sinkhorn_fwd_range, &a);
}

void mhc_sinkhorn_backward(int64_t T, int n, int iters, float floor, const float *logits, const float *grad,
                           float *grad_logits, int threads) {
    struct sinkhorn_args a = {n, iters, floor, logits, grad, NULL, grad_logits};
    parallel_for(T, threads, sinkhorn_bwd_range, &a);
}

/* ---- the read, inp = sum_j pre_j x_j, and its transpose, the per stream dot products out_j = x_j . g
   (dL/dpre from dL/dinp): v is pre (T, n) for the one, g (T, d) for the other ---- */

struct stream_args {
    int n, d;
    const float *x, *v;
    float *out;
};

static void read_range(const void *p, int64_t lo, int64_t hi) {
    const struct stream_args *a = p;
    int n = a->n, d = a->d;
    for (int64_t t = lo; t < hi; t++) {
        const float *x = a->x + t * n * d, *pre = a->v + t * n;
        float *restrict o = a->out + t * d;
        for (int k = 0; k < d; k++) o[k] = pre[0] * x[k];
        for (int j = 1; j < n; j++) {
            const float *restrict xj = x + j * d;
            float w = pre[j];
            for (int k = 0; k < d; k++) o[k] += w * xj[k];
        }
    }
}

static void dots_range(const void *p, int64_t lo, int64_t hi) {
    const struct stream_args *a = p;
    int n = a->n, d = a->d;
    for (int64_t t = lo; t < hi; t++) {
        const float *restrict g = a->v + t * d;
        for (int j = 0; j < n; j++) {
            const float *restrict xj = a->x + (t * n + j) * d;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int k = 0; k < d; k++) s += xj[k] * g[k];
            a->out[t * n + j] = s;
        }
    }
}

void mhc_read(int64_t T, int n, int d, const float *pre, const float *x, float *inp, int threads) {
    struct stream_args a = {n, d, x, pre, inp};
    parallel_for(T, threads, read_range, &a);
}

void mhc_stream_dots(int64_t T, int n, int d, const float *x, const float *g, float *out, int threads) {
    struct stream_args a = {n, d, x, g, out};
    parallel_for(T, threads, dots_range, &a);
}

/* ---- dL/dx of the projection and the read: gx += pre (x) g_inp + c x ----
   (gx comes in holding dL/d(x W^T) W, a matrix product better left to BLAS; c: the RMS scale's part, (T,)) */

struct pre_grad_args {
    int n, d;
    const float *pre, *g_inp, *c, *x;
    float *gx;
};

static void pre_grad_range(const void *p, int64_t lo, int64_t hi) {
    const struct pre_grad_args *a = p;
    int n = a->n, d = a->d;
    for (int64_t t = lo; t < hi; t++) {
        const float *restrict g = a->g_inp + t * d;
        float c = a->c[t];
        for (int j = 0; j < n; j++) {
            const float *restrict x = a->x + (t * n + j) * d;
            float *restrict gx = a->gx + (t * n + j) * d;
            float w = a->pre[t * n + j];
            for (int k = 0; k < d; k++) gx[k] += w * g[k] + c * x[k];
        }
    }
}

void mhc_pre_grad(int64_t T, int n, int d, const float *pre, const float *g_inp, const float *c, const float *x,
                  float *gx, int threads) {
    struct pre_grad_args a = {n, d, pre, g_inp, c, x, gx};
    parallel_for(T, threads, pre_grad_range, &a);
}

/* ---- the new streams: out_i = sum_j res_ij x_j + post_i f ---- */

struct write_args {
    int n, d;
    const float *res, *x, *post, *f, *grad;
    float *out, *g_res, *g_x, *g_post, *g_f;
};

static void write_fwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct write_args *a = p;
    int n = a->n, d = a->d;
    for (int64_t t = lo; t < hi; t++) {
        const float *x = a->x + t * n * d, *res = a->res + t * n * n;
        const float *restrict f = a->f + t * d;
        for (int i = 0; i < n; i++) {
            float *restrict o = a->out + (t * n + i) * d;
            float w = a->post[t * n + i];
            for (int k = 0; k < d; k++) o[k] = w * f[k];
            for (int j = 0; j < n; j++) {
                const float *restrict xj = x + j * d;
                float r = res[i * n + j];
                for (int k = 0; k < d; k++) o[k] += r * xj[k];
            }
        }
    }
}

void mhc_write_forward(int64_t T, int n, int d, const float *res, const float *x, const float *post, const float *f,
                       float *out, int threads) {
    struct write_args a = {n, d, res, x, post, f, NULL, out, NULL, NULL, NULL, NULL};
    parallel_for(T, threads, write_fwd_range, &a);
}

/* g_x_j = sum_i res_ij grad_i; g_res_ij = grad_i . x_j; g_post_i = grad_i . f; g_f = sum_i post_i grad_i */
static void write_bwd_range(const void *p, int64_t lo, int64_t hi) {
    const struct write_args *a = p;
    int n = a->n, d = a->d;
    for (int64_t t = lo; t < hi; t++) {
        const float *x = a->x + t * n * d, *grad = a->grad + t * n * d, *res = a->res + t * n * n;
        const float *restrict f = a->f + t * d;
        float *restrict gf = a->g_f + t * d;
        for (int j = 0; j < n; j++) {
            float *restrict gx = a->g_x + (t * n + j) * d;
            for (int k = 0; k < d; k++) gx[k] = res[j] * grad[k];
            for (int i = 1; i < n; i++) {
                const float *restrict gi = grad + i * d;
                float r = res[i * n + j];
                for (int k = 0; k < d; k++) gx[k] += r * gi[k];
            }
        }
        for (int k = 0; k < d; k++) gf[k] = a->post[t * n] * grad[k];
        for (int i = 1; i < n; i++) {
            const float *restrict gi = grad + i * d;
            float w = a->post[t * n + i];
            for (int k = 0; k < d; k++) gf[k] += w * gi[k];
        }
        for (int i = 0; i < n; i++) {
            const float *restrict gi = grad + i * d;
            for (int j = 0; j < n; j++) {
                const float *restrict xj = x + j * d;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int k = 0; k < d; k++) s += gi[k] * xj[k];
                a->g_res[(t * n + i) * n + j] = s;
            }
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int k = 0; k < d; k++) s += gi[k] * f[k];
            a->g_post[t * n + i] = s;
        }
    }
}

void mhc_write_backward(int64_t T, int n, int d, const float *grad, const float *res, const float *x,
                        const float *post, const float *f, float *g_res, float *g_x, float *g_post, float *g_f,
                        int threads) {
    struct write_args a = {n, d, res, x, post, f, grad, NULL, g_res, g_x, g_post, g_f};
    parallel_for(T, threads, write_bwd_range, &a);
}
