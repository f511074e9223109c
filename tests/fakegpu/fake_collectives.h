/* The all-reduce family at several ranks, for the fake libcuda (tests/fakegpu/README.md).
 *
 * Each rank is a process; the heaps are files every process maps (the nvshmem stand-in), so
 * the kernels' peer pointers are plain pointers here. One emulated "block" runs the call:
 * the cross-rank protocol of collectives/kernels/allreduce.cu (flags, stages, the epoch, the
 * call signatures, deadlines, a poisoned status) with atomic loads and stores, and the data
 * movement and reductions in the kernels' accumulation types (float for 16-bit and float32,
 * double for float32_acc64 and float64, integers in their own width with wrap-around). Types
 * the fake does not reduce (bool, float8, complex) are refused with UNEMULATED: pick tests
 * that avoid them.
 */
typedef struct {
    uint64_t** flags; unsigned* arrive; uint64_t stage0, timeout_ns; int* status; int rank, size;
    uint64_t sig;
} FSync;

static uint64_t* fs_epoch(const FSync* s) { return (uint64_t*)(s->arrive + 2); }

/* every rank has published stage ``want`` (and, at stage0, the same call signature) */
static int fs_wait(const FSync* s, uint64_t want) {
    if (__atomic_load_n(s->status, __ATOMIC_ACQUIRE) != 0) return 0;
    uint64_t t0 = now_ns();  /* one deadline for all peers: the kernel waits on them at once */
    for (int t = 0; t < s->size; t++) {
        uint64_t* flag = &s->flags[s->rank][t];
        while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < want) {
            if (__atomic_load_n(s->status, __ATOMIC_ACQUIRE) != 0 || now_ns() - t0 > s->timeout_ns) {
                int zero = 0;
                __atomic_compare_exchange_n(s->status, &zero, (int)(want + 2 - s->stage0), 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
                return 0;
            }
            spin_pause();
        }
        if (want == s->stage0 && s->sig != 0) {
            uint64_t theirs = __atomic_load_n(&s->flags[s->rank][s->size + t], __ATOMIC_ACQUIRE);
            if (theirs != s->sig) {
                int zero = 0;
                __atomic_compare_exchange_n(s->status, &zero, -t - 1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE);
                return 0;
            }
        }
    }
    return 1;
}

/* the last (only) block arrives at stage k: publish it, with the signature at k == 0 */
static void fs_arrive(const FSync* s, int k) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (k == 0 && s->sig != 0)
        for (int r = 0; r < s->size; r++)
            __atomic_store_n(&s->flags[r][s->size + s->rank], s->sig, __ATOMIC_RELEASE);
    *fs_epoch(s) = s->stage0 + (uint64_t)k;
    for (int r = 0; r < s->size; r++)
        __atomic_store_n(&s->flags[r][s->rank], s->stage0 + (uint64_t)k, __ATOMIC_RELEASE);
}

/* the launch's stage parameters (SYNC_PARAMS), by name (kernel_signatures.py) */
static FSync fs_params(const char* nm, void** params) {
    FSync s;
    unsigned* arrive = ARG(unsigned*, arrive);
    unsigned base = ARG(unsigned, arrive_base);
    if (*arrive != 0 || base != 0)  /* as at one rank: the counter starts each launch at 0 */
        fprintf(stderr, "[fake] ARRIVE MISMATCH: counter %u, host base %u (both 0: device-side stages)\n", *arrive, base);
    s.flags = ARG(uint64_t**, flags);
    s.arrive = arrive;
    s.stage0 = ARG(uint64_t, stage0);
    s.timeout_ns = ARG(uint64_t, timeout_ns);
    s.status = ARG(int*, status);
    s.rank = ARG(int, rank);
    s.size = ARG(int, size);
    s.sig = fk_pos(nm, FKP_sig) >= 0 ? ARG(uint64_t, sig) : 0;  /* allreduce_drain has none */
    if (s.stage0 == 0) s.stage0 = *fs_epoch(&s) + 1;
    return s;
}

/* -- element types and the kernels' arithmetic ---------------------------------------------- */

enum { FK_F16, FK_BF16, FK_F32, FK_F64, FK_INT, FK_UINT, FK_NONE };
typedef struct { int kind, size; } FType;
enum { FA_FLOAT, FA_DOUBLE, FA_INT };

static FType ft_parse(const char* dt) {
    FType t = {FK_NONE, 0};
    if (tok(dt, "float16")) t = (FType){FK_F16, 2};
    else if (tok(dt, "bfloat16")) t = (FType){FK_BF16, 2};
    else if (tok(dt, "float32")) t = (FType){FK_F32, 4};
    else if (tok(dt, "float64")) t = (FType){FK_F64, 8};
    else if (tok(dt, "int8")) t = (FType){FK_INT, 1};
    else if (tok(dt, "int16")) t = (FType){FK_INT, 2};
    else if (tok(dt, "int32")) t = (FType){FK_INT, 4};
    else if (tok(dt, "int64")) t = (FType){FK_INT, 8};
    else if (tok(dt, "uint8")) t = (FType){FK_UINT, 1};
    else if (tok(dt, "uint16")) t = (FType){FK_UINT, 2};
    else if (tok(dt, "uint32")) t = (FType){FK_UINT, 4};
    else if (tok(dt, "uint64")) t = (FType){FK_UINT, 8};
    return t;
}

/* a value in the accumulation type: f (float), d (double) or i (64-bit pattern of an integer) */
typedef struct { float f; double d; uint64_t i; } FVal;

static FVal fv_load(const char* p, uint64_t idx, FType t, int acc) {
    FVal v = {0, 0, 0};
    if (t.kind == FK_INT || t.kind == FK_UINT) {
        if (t.size == 1) v.i = t.kind == FK_INT ? (uint64_t)(int64_t)((const int8_t*)p)[idx] : ((const uint8_t*)p)[idx];
        else if (t.size == 2) v.i = t.kind == FK_INT ? (uint64_t)(int64_t)((const int16_t*)p)[idx] : ((const uint16_t*)p)[idx];
        else if (t.size == 4) v.i = t.kind == FK_INT ? (uint64_t)(int64_t)((const int32_t*)p)[idx] : ((const uint32_t*)p)[idx];
        else v.i = ((const uint64_t*)p)[idx];
        return v;
    }
    double x = t.kind == FK_F64 ? ((const double*)p)[idx] : t.kind == FK_F32 ? (double)((const float*)p)[idx]
             : fa_load(p, (i64)idx, t.kind == FK_BF16 ? 2 : 1);
    if (acc == FA_FLOAT) v.f = (float)x; else v.d = x;
    return v;
}

static uint64_t fi_wrap(uint64_t x, FType t) {  /* to the type's width, sign-extended if signed */
    if (t.size == 8) return x;
    unsigned bits = 8u * (unsigned)t.size;
    uint64_t m = (1ull << bits) - 1, y = x & m;
    if (t.kind == FK_INT && (y >> (bits - 1))) y |= ~m;
    return y;
}

/* op: 0 sum, 1 avg, 2 prod, 3 min, 4 max, 5 band, 6 bor, 7 bxor (collectives/ops.py) */
static FVal fv_apply(int op, FVal a, FVal b, FType t, int acc) {
    if (acc == FA_INT) {
        int sgn = t.kind == FK_INT; int64_t x = (int64_t)a.i, y = (int64_t)b.i; uint64_t r;
        switch (op) {
        case 0: case 1: r = a.i + b.i; break;
        case 2: r = a.i * b.i; break;
        case 3: r = sgn ? (uint64_t)(y < x ? y : x) : (b.i < a.i ? b.i : a.i); break;
        case 4: r = sgn ? (uint64_t)(y > x ? y : x) : (b.i > a.i ? b.i : a.i); break;
        case 5: r = a.i & b.i; break;
        case 6: r = a.i | b.i; break;
        default: r = a.i ^ b.i;
        }
        a.i = fi_wrap(r, t);
        return a;
    }
    if (acc == FA_FLOAT) {
        float x = a.f, y = b.f;
        a.f = op <= 1 ? x + y : op == 2 ? x * y : op == 3 ? ((x < y || x != x) ? x : y) : ((x > y || x != x) ? x : y);
    } else {
        double x = a.d, y = b.d;
        a.d = op <= 1 ? x + y : op == 2 ? x * y : op == 3 ? ((x < y || x != x) ? x : y) : ((x > y || x != x) ? x : y);
    }
    return a;
}

static FVal fv_avg(FVal a, int n, FType t, int acc) {
    if (acc == FA_INT) {
        if (t.kind == FK_INT) a.i = fi_wrap((uint64_t)((int64_t)a.i / n), t);  /* toward zero */
        else a.i = a.i / (uint64_t)n;
    } else if (acc == FA_FLOAT) a.f = a.f / (float)n;
    else a.d = a.d / (double)n;
    return a;
}

static void fv_store(char* p, uint64_t idx, FVal v, FType t, int acc) {
    if (acc == FA_INT) {
        if (t.size == 1) ((uint8_t*)p)[idx] = (uint8_t)v.i;
        else if (t.size == 2) ((uint16_t*)p)[idx] = (uint16_t)v.i;
        else if (t.size == 4) ((uint32_t*)p)[idx] = (uint32_t)v.i;
        else ((uint64_t*)p)[idx] = v.i;
        return;
    }
    double x = acc == FA_FLOAT ? (double)v.f : v.d;
    if (t.kind == FK_F64) ((double*)p)[idx] = x;
    else if (t.kind == FK_F32) ((float*)p)[idx] = acc == FA_FLOAT ? v.f : (float)v.d;
    else if (x != x) ((uint16_t*)p)[idx] = 0x7fff;  /* the GPU's conversions: canonical NaN */
    else fa_store(p, (i64)idx, x, t.kind == FK_BF16 ? 2 : 1);
}

/* out[i - shift] = reduce(inputs[*][i]) for i in [lo, hi) */
static void fv_reduce(char* const* in, char* out, uint64_t lo, uint64_t hi, uint64_t shift,
                      int size, int op, double scale, FType t, FType to, int acc) {
    for (uint64_t i = lo; i < hi; i++) {
        FVal a = fv_load(in[0], i, t, acc);
        for (int r = 1; r < size; r++) a = fv_apply(op, a, fv_load(in[r], i, t, acc), t, acc);
        if (op == 1) a = fv_avg(a, size, t, acc);
        if (scale != 1.0 && acc == FA_FLOAT) a.f = a.f * (float)scale;
        else if (scale != 1.0 && acc == FA_DOUBLE) a.d = a.d * scale;
        fv_store(out, i - shift, a, to, acc);
    }
}

static int fc_op(const char* name) {
    static const char* ops[] = {"sum", "avg", "prod", "min", "max"};
    const char* u = strrchr(name, '_');
    for (int k = 0; u && k < 5; k++) if (!strcmp(u + 1, ops[k])) return k;
    return -1;
}

/* reduce_local_<dtype>_<op>: one process reduces ``count`` buffers it owns, in rank order,
   in the kernels' accumulation type (no stages: collectives/kernels/allreduce.cu) */
static int fake_reduce_local(const char* nm, void** params) {
    if (strncmp(nm, "reduce_local_", 13)) return 0;
    const char* dt = nm + 13;
    FType t = ft_parse(dt);
    int op = fc_op(nm), acc64 = strstr(nm, "_acc64") != 0;
    char* const* in = ARG(char* const*, inputs); char* out = ARG(char*, out);
    uint64_t n = ARG(uint64_t, n); int count = ARG(int, count);
    if (t.kind == FK_NONE || op < 0) { fprintf(stderr, "[fake] UNEMULATED %s\n", nm); return 1; }
    int acc = (t.kind == FK_F64 || acc64) ? FA_DOUBLE : FA_FLOAT;
    fv_reduce(in, out, 0, n, 0, count, op, 1.0, t, t, acc);
    return 1;
}

/* The kernel ``nm`` at several ranks: 1 if it is one of the family's, 0 if not. */
static int fake_collective(const char* nm, void** params) {
    int ar = !strncmp(nm, "allreduce_one_shot_", 19) || !strncmp(nm, "allreduce_two_shot_", 19);
    int rs = !strncmp(nm, "reduce_scatter_", 15);
    int fam = !strncmp(nm, "family_", 7);
    if (!strcmp(nm, "allreduce_drain")) {
        FSync s = fs_params(nm, params);
        fs_wait(&s, s.stage0 - 1);
        return 1;
    }
    if (!ar && !rs && !fam) return 0;
    if (fam) {
        int bc = !strcmp(nm, "family_broadcast"), a2a = !strcmp(nm, "family_all_to_all");
        const char* in = ARG(const char*, input); char** scratch = ARG(char**, scratch); char* out = ARG(char*, out);
        uint64_t nb = ARG(uint64_t, nbytes), stride = 0; int root = 0;
        if (bc) root = ARG(int, root); else stride = ARG(uint64_t, stride);
        FSync s = fs_params(nm, params);
        if (!fs_wait(&s, s.stage0 - 1)) return 1;
        if (a2a) for (int j = 0; j < s.size; j++) memmove(scratch[s.rank] + (uint64_t)j * nb, in + (uint64_t)j * stride, nb);
        else if (!bc || s.rank == root) { if (in != scratch[s.rank]) memmove(scratch[s.rank], in, nb); }
        fs_arrive(&s, 0);
        if (!fs_wait(&s, s.stage0)) return 1;
        if (bc) { if (out != scratch[root]) memmove(out, scratch[root], nb); }
        else if (a2a) for (int r = 0; r < s.size; r++) memmove(out + (uint64_t)r * stride, scratch[r] + (uint64_t)s.rank * nb, nb);
        else for (int r = 0; r < s.size; r++) memmove(out + (uint64_t)r * stride, scratch[r], nb);
        fs_arrive(&s, 1);
        return 1;
    }
    size_t L = strlen(nm);
    int rt = L > 3 && !strcmp(nm + L - 3, "_op");
    int two = ar && nm[10] == 't';
    const char* dt = nm + (ar ? 19 : 15);
    int wide = strstr(nm, "_to_float32") != 0, acc64 = strstr(nm, "_acc64") != 0;
    FType t = ft_parse(dt), to = wide ? (FType){FK_F32, 4} : t;
    const char* in = ARG(const char*, input); char** scratch = ARG(char**, scratch);
    char** results = two ? ARG(char**, results) : 0;
    char* out = ARG(char*, out); uint64_t n = ARG(uint64_t, n);
    uint64_t lo = 0, hi = 0; double scale = 1.0;
    if (rs) { lo = ARG(uint64_t, lo); hi = ARG(uint64_t, hi); }
    else scale = ARG(double, scale);
    int op = rt ? ARG(int, op) : fc_op(nm);
    FSync s = fs_params(nm, params);
    int acc = t.kind == FK_INT || t.kind == FK_UINT ? FA_INT : (t.kind == FK_F64 || acc64) ? FA_DOUBLE : FA_FLOAT;
    if (t.kind == FK_NONE || op < 0 || op > 7 || (acc != FA_INT && op > 4)) {
        fprintf(stderr, "[fake] UNEMULATED %s at %d ranks (dtype or op)\n", nm, s.size);
        int zero = 0;
        __atomic_compare_exchange_n(s.status, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return 1;
    }
    if (!fs_wait(&s, s.stage0 - 1)) return 1;
    if (in != scratch[s.rank]) memmove(scratch[s.rank], in, n * (uint64_t)t.size);
    fs_arrive(&s, 0);
    if (!fs_wait(&s, s.stage0)) return 1;
    if (rs) {
        fv_reduce(scratch, out, lo, hi, lo, s.size, op, 1.0, t, t, acc);
        fs_arrive(&s, 1);
        return 1;
    }
    if (!two) {
        fv_reduce(scratch, out, 0, n, 0, s.size, op, scale, t, to, acc);
        fs_arrive(&s, 1);
        return 1;
    }
    uint64_t base = n / (uint64_t)s.size, extra = n % (uint64_t)s.size, a, b;
#define FC_SHARD(r) (a = (uint64_t)(r) * base + ((uint64_t)(r) < extra ? (uint64_t)(r) : extra), b = a + base + ((uint64_t)(r) < extra ? 1 : 0))
    FC_SHARD(s.rank);
    /* results[r] holds rank r's shard at its own offsets, in the output type */
    fv_reduce(scratch, results[s.rank], a, b, 0, s.size, op, scale, t, to, acc);
    fs_arrive(&s, 1);
    if (!fs_wait(&s, s.stage0 + 1)) return 1;
    for (int r = 0; r < s.size; r++) {
        FC_SHARD(r);
        if (b > a) memmove(out + a * (uint64_t)to.size, results[r] + a * (uint64_t)to.size, (b - a) * (uint64_t)to.size);
    }
#undef FC_SHARD
    fs_arrive(&s, 2);
    return 1;
}
