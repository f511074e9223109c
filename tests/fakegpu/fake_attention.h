/* The attention kernels of collectives/kernels/attention.cu, emulated by name for the fake
 * driver: the same parameter lists (read by name, ARG: tests/fakegpu/kernel_signatures.py),
 * the same work-order stepping (modes, traces, the queued counters, which must be zero at
 * launch), the same masks; arithmetic in double, one CTA after another. What it checks is the Python launcher (collectives/mha/gpu.py): argument
 * order and types, strides, grids, buffers; not the CUDA code. */
#include <math.h>

typedef long long i64;

static double fa_load(const void* p, i64 i, int dt) {
    if (dt == 8) return ((const double*)p)[i];
    if (dt == 4) return ((const float*)p)[i];
    uint16_t h = ((const uint16_t*)p)[i];
    if (dt == 2) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
    /* float16, through a table of all 65536 values (built once: ldexp per load was slow) */
    static double table[65536]; static int built;
    if (!__atomic_load_n(&built, __ATOMIC_ACQUIRE)) {
        for (int b = 0; b < 65536; b++) {
            int s = b >> 15, e = (b >> 10) & 31, m = b & 1023; double v;
            if (e == 0) v = ldexp(m, -24); else if (e == 31) v = m ? NAN : INFINITY; else v = ldexp(m + 1024, e - 25);
            table[b] = s ? -v : v;
        }
        __atomic_store_n(&built, 1, __ATOMIC_RELEASE);
    }
    return table[h];
}
static void fa_store(void* p, i64 i, double x, int dt) {
    if (dt == 8) { ((double*)p)[i] = x; return; }
    if (dt == 4) { ((float*)p)[i] = (float)x; return; }
    float f = (float)x; uint32_t u; memcpy(&u, &f, 4);
    if (dt == 2) { uint32_t r = u + 0x7fff + ((u >> 16) & 1); ((uint16_t*)p)[i] = (uint16_t)(r >> 16); return; }
    /* float16, round to nearest even (normal range; enough for attention outputs) */
    int s = (u >> 31) & 1; double a = fabs(x); uint16_t h;
    if (a >= 65520.0) h = 0x7c00; else if (a < ldexp(1, -14)) h = (uint16_t)lrint(a / ldexp(1, -24));
    else { int e; double fr = frexp(a, &e); h = (uint16_t)(((e + 14) << 10) + (uint16_t)lrint((fr * 2 - 1) * 1024)); }
    ((uint16_t*)p)[i] = (uint16_t)(h | (s << 15));
}
static int fa_dtype(const char* s) { return !strncmp(s, "bfloat16", 8) ? 2 : !strncmp(s, "float16", 7) ? 1 : 4; }
/* query row i stands at key position i + delta */
static int fa_visible(int causal, int left, int right, int delta, int i, int j, int k0, int k1) {
    int p = i + delta;
    return j >= k0 && j < k1 && (!causal || j <= p) && (left < 0 || j >= p - left) && (right < 0 || j <= p + right);
}
static void fa_kv_range(int causal, int left, int right, int delta, int q0, int q1, int n, int* k0, int* k1) {
    int s = 0, e = n;
    if (causal && q1 + delta < e) e = q1 + delta;
    if (left >= 0 && q0 + delta - left > s) s = q0 + delta - left;
    if (right >= 0 && q1 + delta + right < e) e = q1 + delta + right;
    if (s > n) s = n;
    *k0 = s; *k1 = e > s ? e : s;
}

/* 1 when nm is an attention kernel (emulated), 0 otherwise */
static int fake_attention(const char* nm, unsigned gx, unsigned gy, unsigned gz, void** params) {
    if (!strncmp(nm, "mha_fwd_", 8)) {
        int dt = fa_dtype(nm + 8);
        const void *q = ARG(const void*, q), *kk = ARG(const void*, k), *v = ARG(const void*, v);
        void* o = ARG(void*, o); float* lse = ARG(float*, lse);
        const int* order = ARG(const int*, order); int items = ARG(int, num_items), mode = ARG(int, mode);
        int* ctr = ARG(int*, counters); const i64* ro = ARG(const i64*, row_offsets); int seq = ARG(int, seq_len);
        int kvlen = ARG(int, kv_len);
        int* trace = ARG(int*, trace); int cap = ARG(int, trace_cap);
        static const int strides[15] = {FKP_q_sb, FKP_q_ss, FKP_q_sh, FKP_k_sb, FKP_k_ss, FKP_k_sh, FKP_v_sb, FKP_v_ss,
                                        FKP_v_sh, FKP_o_sb, FKP_o_ss, FKP_o_sh, FKP_l_sb, FKP_l_ss, FKP_l_sh};
        i64 st[15]; for (int i = 0; i < 15; i++) st[i] = *(i64*)fk_arg(nm, params, strides[i], sizeof(i64));
        int causal = ARG(int, causal), left = ARG(int, left), right = ARG(int, right), delta = ARG(int, delta), group = ARG(int, group);
        float sl2 = ARG(float, scale_log2);
        const char* dpos = strstr(nm, "_d");
        int d = strstr(nm, "general") ? ARG(int, d) : atoi(dpos ? dpos + 2 : "0");
        LOG("  mha_fwd dt=%d d=%d items=%d mode=%d grid=%u causal=%d left=%d right=%d delta=%d kv=%d group=%d", dt, d, items, mode, gx, causal, left, right, delta, kvlen, group);
        if (ro && (kvlen || delta)) fprintf(stderr, "[fake] RAGGED with kv_len %d delta %d\n", kvlen, delta);
        if (mode == 2 && ctr && (ctr[0] || ctr[1])) fprintf(stderr, "[fake] COUNTERS not zero at launch: %d %d\n", ctr[0], ctr[1]);
        double* acc = malloc(sizeof(double) * d); double* sc = 0; int sc_n = 0;
        for (unsigned cta = 0; cta < gx; cta++) {
            int idx = cta, done = 0;
            if (mode == 1) while (idx < items && order[3*idx+2] * 64 >= (ro ? (int)(ro[order[3*idx]+1] - ro[order[3*idx]]) : seq)) idx += gx;
            for (;;) {
                if (mode == 2) while (idx < items && order[3*idx+2] * 64 >= (ro ? (int)(ro[order[3*idx]+1] - ro[order[3*idx]]) : seq)) idx = gx + ctr[0]++;
                if (idx >= items) break;
                if (trace && done < cap) trace[cta * cap + done] = idx + 1;
                done++;
                int b = order[3*idx], h = order[3*idx+1], tile = order[3*idx+2];
                int n = ro ? (int)(ro[b+1] - ro[b]) : seq; i64 start = ro ? ro[b] : 0; int bb = ro ? 0 : b, hk = h / group;
                if (tile * 64 < n) {
                    int q0 = tile * 64, q1 = q0 + 64 < n ? q0 + 64 : n, k0, k1;
                    fa_kv_range(causal, left, right, delta, q0, q1, ro ? n : kvlen, &k0, &k1);
                    if (k1 - k0 > sc_n) { sc_n = k1 - k0; sc = realloc(sc, sizeof(double) * sc_n); }
                    for (int i = q0; i < q1; i++) {
                        i64 qrow = bb*st[0] + (start+i)*st[1] + h*st[2];
                        double m = -INFINITY, l = 0;
                        for (int j = k0; j < k1; j++) {
                            double s = -INFINITY;
                            if (fa_visible(causal, left, right, delta, i, j, k0, k1)) {
                                i64 krow = bb*st[3] + (start+j)*st[4] + hk*st[5]; s = 0;
                                for (int c = 0; c < d; c++) s += fa_load(q, qrow + c, dt) * fa_load(kk, krow + c, dt);
                                s *= sl2;
                            }
                            sc[j-k0] = s; if (s > m) m = s;
                        }
                        for (int c = 0; c < d; c++) acc[c] = 0;
                        for (int j = k0; j < k1; j++) {
                            if (sc[j-k0] == -INFINITY) continue;
                            double p = exp2(sc[j-k0] - m); l += p;
                            i64 vrow = bb*st[6] + (start+j)*st[7] + hk*st[8];
                            for (int c = 0; c < d; c++) acc[c] += p * fa_load(v, vrow + c, dt);
                        }
                        i64 orow = bb*st[9] + (start+i)*st[10] + h*st[11];
                        for (int c = 0; c < d; c++) fa_store(o, orow + c, l > 0 ? acc[c] / l : 0, dt);
                        lse[bb*st[12] + (start+i)*st[13] + h*st[14]] = l > 0 ? (float)((m + log2(l)) * M_LN2) : -INFINITY;
                    }
                }
                if (mode == 0) break;
                idx = mode == 1 ? idx + (int)gx : (int)gx + ctr[0]++;
                if (mode == 1) while (idx < items && order[3*idx+2] * 64 >= (ro ? (int)(ro[order[3*idx]+1] - ro[order[3*idx]]) : seq)) idx += gx;
            }
        }
        if (mode == 2) { ctr[0] = 0; ctr[1] = 0; }
        free(acc); free(sc);
        return 1;
    }
    if (!strncmp(nm, "mha_merge_", 10)) {  /* fold a unit's partial (O, LSE) by log-sum-exp */
        int dt = fa_dtype(nm + 10);
        float* out = ARG(float*, out); float* lse = ARG(float*, lse);
        const void* part = ARG(const void*, part); const float* pl = ARG(const float*, part_lse);
        i64 rows = ARG(i64, rows); int d = ARG(int, d);
        LOG("  mha_merge dt=%d rows=%lld d=%d grid=%u", dt, rows, d, gx);
        if ((i64)gx * 4 < rows) fprintf(stderr, "[fake] MERGE grid too small\n");
        for (i64 r = 0; r < rows; r++) {
            double a = lse[r], b = pl[r], hi = a > b ? a : b, lo = a > b ? b : a;
            if (hi == -INFINITY) continue;
            double ln = lo == -INFINITY ? hi : hi + log1p(exp(lo - hi));
            double wo = a == -INFINITY ? 0 : exp(a - ln), wn = b == -INFINITY ? 0 : exp(b - ln);
            for (int c = 0; c < d; c++) out[r*d + c] = (float)(out[r*d + c] * wo + fa_load(part, r*d + c, dt) * wn);
            lse[r] = (float)ln;
        }
        return 1;
    }
    if (!strncmp(nm, "mha_accumulate_", 15)) {
        int dt = fa_dtype(nm + 15);
        float* dst = ARG(float*, dst); const void* src = ARG(const void*, src); i64 n = ARG(i64, n);
        for (i64 i = 0; i < n; i++) dst[i] = (float)(dst[i] + fa_load(src, i, dt));
        return 1;
    }
    if (!strncmp(nm, "mha_cast_", 9)) {
        int dt = fa_dtype(nm + 9);
        void* dst = ARG(void*, dst); const float* src = ARG(const float*, src); i64 n = ARG(i64, n);
        for (i64 i = 0; i < n; i++) fa_store(dst, i, src[i], dt);
        return 1;
    }
    if (!strncmp(nm, "mha_bwd_dvec_", 13)) {
        int dt = fa_dtype(nm + 13);
        const void *o = ARG(const void*, o), *dout = ARG(const void*, dout); float* dvec = ARG(float*, dvec);
        i64 rows = ARG(i64, rows); int heads = ARG(int, heads), d = ARG(int, d);
        LOG("  mha_bwd_dvec rows=%lld heads=%d d=%d grid=%u", rows, heads, d, gx);
        if ((i64)gx * 4 < rows * heads) fprintf(stderr, "[fake] DVEC grid too small\n");
        for (i64 w = 0; w < rows * heads; w++) { double s = 0; for (int c = 0; c < d; c++) s += fa_load(o, w*d + c, dt) * fa_load(dout, w*d + c, dt); dvec[w] = (float)s; }
        return 1;
    }
    int dkdv = !strncmp(nm, "mha_bwd_dkdv_", 13), dq = !strncmp(nm, "mha_bwd_dq_", 11);
    if (!dkdv && !dq) return 0;
    int dt = fa_dtype(nm + (dkdv ? 13 : 11));
    const void *q = ARG(const void*, q), *kk = ARG(const void*, k), *v = ARG(const void*, v), *dout = ARG(const void*, dout);
    const float* lse = ARG(const float*, lse); const float* dvec = ARG(const float*, dvec);
    void *g1 = dkdv ? ARG(void*, dk) : ARG(void*, dq), *g2 = dkdv ? ARG(void*, dv) : 0;
    const i64* ro = ARG(const i64*, row_offsets); int seq = ARG(int, seq_len), kvlen = ARG(int, kv_len);
    int heads = ARG(int, heads), kvh = ARG(int, kv_heads), d = ARG(int, d);
    int causal = ARG(int, causal), left = ARG(int, left), right = ARG(int, right), delta = ARG(int, delta);
    double scale = ARG(float, scale);
    int group = heads / kvh;
    LOG("  %s grid=(%u,%u,%u) heads=%d kv=%d d=%d", nm, gx, gy, gz, heads, kvh, d);
    if (gz != (unsigned)(dkdv ? kvh : heads)) fprintf(stderr, "[fake] BWD grid z %u, expected %d\n", gz, dkdv ? kvh : heads);
    double* a1 = malloc(sizeof(double) * d); double* a2 = malloc(sizeof(double) * d);
    for (unsigned b = 0; b < gy; b++) {
        int n = ro ? (int)(ro[b+1] - ro[b]) : seq; i64 first = ro ? ro[b] : (i64)b * seq;
        int nk = ro ? n : kvlen; i64 kfirst = ro ? ro[b] : (i64)b * kvlen;
        int nx = dkdv ? nk : n, ny = dkdv ? n : nk;
        if ((int)gx * 32 < nx) fprintf(stderr, "[fake] BWD grid x %u too small for %d rows\n", gx, nx);
        for (unsigned hz = 0; hz < gz; hz++)
            for (int x = 0; x < nx; x++) {  /* x: a key (dkdv) or a query row (dq) */
                for (int c = 0; c < d; c++) a1[c] = a2[c] = 0;
                int h0 = dkdv ? hz * group : hz, h1 = dkdv ? h0 + group : hz + 1;
                for (int h = h0; h < h1; h++)
                    for (int y = 0; y < ny; y++) {
                        int i = dkdv ? y : x, j = dkdv ? x : y, hk = h / group;
                        float L = lse[(first+i)*heads + h];
                        if (L == -INFINITY || !fa_visible(causal, left, right, delta, i, j, 0, nk)) continue;
                        i64 qa = ((first+i)*heads + h)*d, ka = ((kfirst+j)*kvh + hk)*d;
                        double s = 0, dp = 0;
                        for (int c = 0; c < d; c++) { s += fa_load(q, qa+c, dt) * fa_load(kk, ka+c, dt); dp += fa_load(dout, qa+c, dt) * fa_load(v, ka+c, dt); }
                        double p = exp(s * scale - L), ds = p * (dp - dvec[(first+i)*heads + h]) * scale;
                        for (int c = 0; c < d; c++) {
                            if (dkdv) { a1[c] += ds * fa_load(q, qa+c, dt); a2[c] += p * fa_load(dout, qa+c, dt); }
                            else a1[c] += ds * fa_load(kk, ka+c, dt);
                        }
                    }
                i64 at = dkdv ? ((kfirst+x)*kvh + hz)*d : ((first+x)*heads + hz)*d;
                for (int c = 0; c < d; c++) { fa_store(g1, at+c, a1[c], dt); if (dkdv) fa_store(g2, at+c, a2[c], dt); }
            }
    }
    free(a1); free(a2);
    return 1;
}
