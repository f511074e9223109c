/* What the recording NVRTC (fake_nvrtc.c) and the fake libcuda agree on to find a cubin's
   source: the cubin's length, read from its ELF headers (cuLibraryLoadData is given a
   pointer only), and the key of its record, a 128-bit FNV-1a hash of those bytes. */
#ifndef FAKE_CUBIN_H
#define FAKE_CUBIN_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* bytes of the ELF64 image at p (its headers, program and section tables and sections), or
   0 if it is not one */
static size_t fake_elf_extent(const void* p) {
    const unsigned char* e = (const unsigned char*)p;
    if (!e || memcmp(e, "\x7f" "ELF", 4) != 0 || e[4] != 2) return 0;
    uint64_t phoff, shoff, end = 64;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, e + 0x20, 8);
    memcpy(&shoff, e + 0x28, 8);
    memcpy(&phentsize, e + 0x36, 2);
    memcpy(&phnum, e + 0x38, 2);
    memcpy(&shentsize, e + 0x3a, 2);
    memcpy(&shnum, e + 0x3c, 2);
    if (phoff + (uint64_t)phnum * phentsize > end) end = phoff + (uint64_t)phnum * phentsize;
    if (shoff + (uint64_t)shnum * shentsize > end) end = shoff + (uint64_t)shnum * shentsize;
    for (uint16_t i = 0; i < shnum; i++) {
        const unsigned char* s = e + shoff + (uint64_t)i * shentsize;
        uint32_t type;
        uint64_t off, size;
        memcpy(&type, s + 4, 4);
        memcpy(&off, s + 0x18, 8);
        memcpy(&size, s + 0x20, 8);
        if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
    }
    return (size_t)end;
}

static void fake_cubin_key(const void* p, size_t n, char out[33]) {
    const unsigned char* b = (const unsigned char*)p;
    uint64_t a = 0xcbf29ce484222325ull, c = 0x84222325cbf29ce4ull;
    for (size_t i = 0; i < n; i++) {
        a = (a ^ b[i]) * 0x100000001b3ull;
        c = (c ^ b[i]) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)a, (unsigned long long)c);
}
#endif
