/* The flight recorder's ring, as its C writers see it (shmem.flight: layout.py is the format;
 * shmem/flight/_ring.c records the calls made from Python, collectives/_replay.c the cached
 * collectives it replays). Every writer runs under the GIL and none releases it between
 * reading and writing the ring's words, so they need no lock against each other. */
#ifndef SHMEM_FLIGHT_RING_H
#define SHMEM_FLIGHT_RING_H

#include <stdint.h>
#include <string.h>
#include <time.h>

/* a record ("=qqddqihhi12s", 64 bytes) */
typedef struct {
    int64_t seq, nbytes;
    double t_start, t_end;
    int64_t number;
    int32_t stream;
    int16_t op, state;
    int32_t peer;
    char dtype[12];
} FlightRecord;
_Static_assert(sizeof(FlightRecord) == 64, "shmem.flight's records are 64 bytes");

enum { FLIGHT_HEADER = 128, FLIGHT_STREAMS = 64, FLIGHT_NEXT = 4, FLIGHT_ENABLED = 5 };
/* the header, then each stream's counter and its members' CRC, then the records */
enum { FLIGHT_RECORDS_AT = FLIGHT_HEADER + 2 * FLIGHT_STREAMS * 8 };
enum { FLIGHT_PENDING = 1, FLIGHT_DONE = 2, FLIGHT_FAILED = 3 };
enum { FLIGHT_WAIT_COUNTER = FLIGHT_STREAMS - 1 }; /* the waits' counter (no stream's) */

typedef struct {
    int64_t *words;    /* the header's int64 words (NULL: no ring) */
    int64_t *counters; /* each stream's */
    FlightRecord *records;
    int64_t capacity, mask; /* mask: capacity - 1 for a power of two (no division), else 0 */
} FlightRing;

/* the wall clock at the kernel tick's resolution (a few ms): 6 ns a read where the precise
 * clock takes 26 (two precise reads were 2.5% of a 2 us all-reduce, 14% of a barrier) */
static inline double flight_clock(void) {
    struct timespec ts;
#ifdef CLOCK_REALTIME_COARSE
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
#else
    clock_gettime(CLOCK_REALTIME, &ts);
#endif
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the ring in ``len`` bytes at ``base`` with ``capacity`` records: 0, or -1 if too small */
static inline int flight_ring_init(FlightRing *r, char *base, int64_t len, int64_t capacity) {
    if (capacity < 1 || len < FLIGHT_RECORDS_AT + capacity * (int64_t)sizeof(FlightRecord))
        return -1;
    r->words = (int64_t *)base;
    r->counters = (int64_t *)(base + FLIGHT_HEADER);
    r->records = (FlightRecord *)(base + FLIGHT_RECORDS_AT);
    r->capacity = capacity;
    r->mask = (capacity & (capacity - 1)) == 0 ? capacity - 1 : 0;
    return 0;
}

static inline FlightRecord *flight_slot(const FlightRing *r, int64_t n) {
    return r->records + (r->mask ? (n & r->mask) : n % r->capacity);
}

/* a pending record like ``proto``, numbered on ``*counter`` (0 when not ``numbered``): its
 * number, or -1 when the ring is off */
static inline int64_t flight_begin(FlightRing *r, const FlightRecord *proto, int64_t *counter,
                                   int numbered) {
    int64_t *w = r->words;
    if (w == NULL || !w[FLIGHT_ENABLED])
        return -1;
    int64_t n = w[FLIGHT_NEXT];
    w[FLIGHT_NEXT] = n + 1;
    FlightRecord *rec = flight_slot(r, n);
    *rec = *proto;
    rec->seq = numbered ? ++*counter : 0;
    rec->number = n;
    rec->t_start = flight_clock();
    rec->state = FLIGHT_PENDING;
    return n;
}

/* record ``n`` done (or failed), unless the ring moved past it */
static inline void flight_end(const FlightRing *r, int64_t n, int failed) {
    if (n < 0 || r->words == NULL)
        return;
    FlightRecord *rec = flight_slot(r, n);
    if (rec->number != n)
        return;
    rec->t_end = flight_clock();
    rec->state = failed ? FLIGHT_FAILED : FLIGHT_DONE;
}

#endif
