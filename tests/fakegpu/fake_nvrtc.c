/* A recording libnvrtc.so.13 (tests/fakegpu/README.md): every NVRTC function goes to the
   real library (FAKE_NVRTC_REAL, its path), and each cubin NVRTC produces is recorded with
   the source and options that made it, in FAKE_KERNEL_SOURCES/<hash of the cubin>.cu and
   .opts. The fake libcuda, given that cubin to load, builds the same source for the CPU
   (cudacpu). Loaded before cuda.bindings looks for NVRTC (LD_PRELOAD), it is the one
   cuda.pathfinder finds "already loaded"; the project's code is unaware of it.

   FAKE_NVRTC=cpu-only compiles nothing: each program's "cubin" is a small ELF image that
   names its source (recorded the same way), for runs that only need the CPU build (the
   planted-bug tests build mutated kernels without NVRTC's minute per source). Such images
   must not share a kernel cache with real cubins. */
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cubin.h"

typedef int nvrtcResult;
typedef struct _nvrtcProgram* nvrtcProgram;

static void* real;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void* sym(const char* name) {
    pthread_mutex_lock(&mu);
    if (!real) {
        const char* path = getenv("FAKE_NVRTC_REAL");
        if (!path || !*path) {
            fprintf(stderr, "[fake nvrtc] FAKE_NVRTC_REAL is not set: the path of the real "
                            "libnvrtc.so.13\n");
            abort();
        }
        real = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!real) {
            fprintf(stderr, "[fake nvrtc] cannot load %s: %s\n", path, dlerror());
            abort();
        }
    }
    pthread_mutex_unlock(&mu);
    void* f = dlsym(real, name);
    if (!f) {
        fprintf(stderr, "[fake nvrtc] the real NVRTC has no %s\n", name);
        abort();
    }
    return f;
}

/* what each live program was made from: its source, then its options (one a line) */
typedef struct Rec { nvrtcProgram prog; char* src; char* opts; struct Rec* next; } Rec;
static Rec* recs;

static Rec* rec_of(nvrtcProgram p) {
    for (Rec* r = recs; r; r = r->next)
        if (r->prog == p) return r;
    return 0;
}

static void put(const char* dir, const char* name, const char* ext, const char* text) {
    char tmp[4200], path[4096];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* (ranks recording the same cubin write the same bytes) */
}

static void record(nvrtcProgram prog, const unsigned char* cubin, size_t n) {
    const char* dir = getenv("FAKE_KERNEL_SOURCES");
    if (!dir || !*dir) return;
    pthread_mutex_lock(&mu);
    Rec* r = rec_of(prog);
    if (r) {
        char key[33];
        size_t extent = fake_elf_extent(cubin);
        fake_cubin_key(cubin, extent && extent <= n ? extent : n, key);
        mkdir(dir, 0755);
        put(dir, key, ".cu", r->src);
        put(dir, key, ".opts", r->opts ? r->opts : "");
    }
    pthread_mutex_unlock(&mu);
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name,
                               int numHeaders, const char* const* headers,
                               const char* const* includeNames) {
    nvrtcResult (*f)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                     const char* const*) = sym("nvrtcCreateProgram");
    nvrtcResult rc = f(prog, src, name, numHeaders, headers, includeNames);
    if (rc == 0) {
        Rec* r = calloc(1, sizeof *r);
        r->prog = *prog;
        r->src = strdup(src ? src : "");
        pthread_mutex_lock(&mu);
        r->next = recs;
        recs = r;
        pthread_mutex_unlock(&mu);
        if (numHeaders > 0)
            fprintf(stderr, "[fake nvrtc] %s: named headers are not recorded (the CPU build "
                            "will not see them)\n", name ? name : "a program");
    }
    return rc;
}

static int cpu_only(void) {
    const char* m = getenv("FAKE_NVRTC");
    return m && !strcmp(m, "cpu-only");
}

/* cpu-only: a 160-byte ELF64 image, one PROGBITS section holding the 32 hex digits of the
   hash of the program's source and options (so fake_elf_extent covers them) */
static unsigned char* synthetic(Rec* r, size_t* n) {
    static __thread unsigned char img[160];
    memset(img, 0, sizeof img);
    memcpy(img, "\x7f" "ELF\x02\x01\x01", 7);
    uint64_t shoff = 64, off = 128, size = 32;
    uint16_t ehsize = 64, shentsize = 64, shnum = 1;
    memcpy(img + 0x28, &shoff, 8);
    memcpy(img + 0x34, &ehsize, 2);
    memcpy(img + 0x3a, &shentsize, 2);
    memcpy(img + 0x3c, &shnum, 2);
    uint32_t progbits = 1;
    memcpy(img + 64 + 4, &progbits, 4);
    memcpy(img + 64 + 0x18, &off, 8);
    memcpy(img + 64 + 0x20, &size, 8);
    size_t len = strlen(r->src) + (r->opts ? strlen(r->opts) : 0) + 2;
    char* both = malloc(len);
    snprintf(both, len, "%s\n%s", r->src, r->opts ? r->opts : "");
    char key[33];
    fake_cubin_key(both, strlen(both), key);
    free(both);
    memcpy(img + off, key, 32);
    *n = sizeof img;
    return img;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char* const* options) {
    nvrtcResult (*f)(nvrtcProgram, int, const char* const*) =
        cpu_only() ? 0 : sym("nvrtcCompileProgram");
    pthread_mutex_lock(&mu);
    Rec* r = rec_of(prog);
    if (r) {
        size_t n = 1;
        for (int i = 0; i < numOptions; i++) n += strlen(options[i]) + 1;
        free(r->opts);
        r->opts = calloc(1, n);
        for (int i = 0; i < numOptions; i++) {
            strcat(r->opts, options[i]);
            strcat(r->opts, "\n");
        }
    }
    pthread_mutex_unlock(&mu);
    return f ? f(prog, numOptions, options) : 0;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
    if (cpu_only()) {
        pthread_mutex_lock(&mu);
        Rec* r = rec_of(prog);
        size_t n = 0;
        unsigned char* img = r ? synthetic(r, &n) : 0;
        pthread_mutex_unlock(&mu);
        if (!img) return 5; /* NVRTC_ERROR_INVALID_PROGRAM */
        memcpy(cubin, img, n);
        record(prog, img, n);
        return 0;
    }
    nvrtcResult (*f)(nvrtcProgram, char*) = sym("nvrtcGetCUBIN");
    nvrtcResult (*size)(nvrtcProgram, size_t*) = sym("nvrtcGetCUBINSize");
    nvrtcResult rc = f(prog, cubin);
    size_t n = 0;
    if (rc == 0 && size(prog, &n) == 0) record(prog, (const unsigned char*)cubin, n);
    return rc;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* n) {
    if (cpu_only()) {
        *n = 160;
        return 0;
    }
    nvrtcResult (*f)(nvrtcProgram, size_t*) = sym("nvrtcGetCUBINSize");
    return f(prog, n);
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* n) {
    if (cpu_only()) {
        *n = 1;
        return 0;
    }
    nvrtcResult (*f)(nvrtcProgram, size_t*) = sym("nvrtcGetProgramLogSize");
    return f(prog, n);
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
    if (cpu_only()) {
        log[0] = 0;
        return 0;
    }
    nvrtcResult (*f)(nvrtcProgram, char*) = sym("nvrtcGetProgramLog");
    return f(prog, log);
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
    nvrtcResult (*f)(nvrtcProgram*) = sym("nvrtcDestroyProgram");
    pthread_mutex_lock(&mu);
    for (Rec** p = &recs; *p; p = &(*p)->next)
        if (prog && (*p)->prog == *prog) {
            Rec* r = *p;
            *p = r->next;
            free(r->src);
            free(r->opts);
            free(r);
            break;
        }
    pthread_mutex_unlock(&mu);
    return f(prog);
}

/* the rest of the library, forwarded as they are */
#define FWD(name, params, args)                                                               \
    nvrtcResult name params {                                                                 \
        nvrtcResult(*f) params = sym(#name);                                                  \
        return f args;                                                                        \
    }
FWD(nvrtcVersion, (int* major, int* minor), (major, minor))
FWD(nvrtcGetNumSupportedArchs, (int* n), (n))
FWD(nvrtcGetSupportedArchs, (int* a), (a))
FWD(nvrtcGetPTXSize, (nvrtcProgram p, size_t* n), (p, n))
FWD(nvrtcGetPTX, (nvrtcProgram p, char* b), (p, b))
FWD(nvrtcGetLTOIRSize, (nvrtcProgram p, size_t* n), (p, n))
FWD(nvrtcGetLTOIR, (nvrtcProgram p, char* b), (p, b))
FWD(nvrtcGetOptiXIRSize, (nvrtcProgram p, size_t* n), (p, n))
FWD(nvrtcGetOptiXIR, (nvrtcProgram p, char* b), (p, b))
FWD(nvrtcGetTileIRSize, (nvrtcProgram p, size_t* n), (p, n))
FWD(nvrtcGetTileIR, (nvrtcProgram p, char* b), (p, b))
FWD(nvrtcAddNameExpression, (nvrtcProgram p, const char* e), (p, e))
FWD(nvrtcGetLoweredName, (nvrtcProgram p, const char* e, const char** l), (p, e, l))
FWD(nvrtcGetPCHHeapSize, (size_t* n), (n))
FWD(nvrtcSetPCHHeapSize, (size_t n), (n))
FWD(nvrtcGetPCHCreateStatus, (nvrtcProgram p), (p))
FWD(nvrtcGetPCHHeapSizeRequired, (nvrtcProgram p, size_t* n), (p, n))
FWD(nvrtcSetFlowCallback, (nvrtcProgram p, int (*cb)(void*, void*), void* payload), (p, cb, payload))
FWD(nvrtcGetBundledHeadersInfo, (void* a, void* b, void* c), (a, b, c))
FWD(nvrtcInstallBundledHeaders, (void* a), (a))
FWD(nvrtcRemoveBundledHeaders, (void* a), (a))

const char* nvrtcGetErrorString(nvrtcResult r) {
    const char* (*f)(nvrtcResult) = sym("nvrtcGetErrorString");
    return f(r);
}
