#define _GNU_SOURCE 1
#include <string.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>
#include <time.h>
typedef int CUresult;
typedef struct { unsigned gx,gy,gz,bx,by,bz,shm; void* hStream; void* attrs; unsigned nattrs; } CUlaunchConfig;
static int g_ctx_dummy; static void* g_cur = 0;
static int streamdev(void* s);
static int curdev(void);
#define LOG(...) do{ if(getenv("FAKE_LOG")) {fprintf(stderr,"[fake] " __VA_ARGS__); fputc('\n',stderr);} }while(0)
#include "fake_async.h"
/* The kernels' launch parameters by name, never by position: the positions come from one
   table, tests/fakegpu/kernel_signatures.py, which the fake's build writes as
   fake_kernel_params.h into its build folder (cc -I that folder) and a unit test checks
   against the .cu kernels. ARG(type, name) is the launch's parameter `name` read as `type`;
   a kernel not in the table, a name its kernel has not, or a type of another size than the
   table's stops the process with SIGNATURE. */
#include "fake_kernel_params.h"
_Static_assert(FK_MAX_PARAMS <= FA_SLOTS, "fake_async.h copies FA_SLOTS parameters a launch");
static int fk_match(const char* pat,const char* nm){ const char* star=strchr(pat,'*'); if(!star) return !strcmp(pat,nm); /* '*': one or more characters */
  size_t a=(size_t)(star-pat), b=strlen(star+1), n=strlen(nm); return n>a+b && !strncmp(nm,pat,a) && !strcmp(nm+n-b,star+1); }
static const FKSig* fk_sig(const char* nm){ for(const FKSig* s=fk_sigs;s->pattern;s++) if(fk_match(s->pattern,nm)) return s; return 0; } /* the first row matching, as kernel_signatures.family_of */
static int fk_pos(const char* nm,int id){ const FKSig* s=fk_sig(nm); for(int i=0;s && i<s->n;i++) if(s->param[i]==id) return i; return -1; }
static void* fk_arg(const char* nm,void** params,int id,size_t size){
  const FKSig* s=fk_sig(nm); int i=fk_pos(nm,id);
  if(!s){ fprintf(stderr,"[fake] SIGNATURE: kernel %s is not in tests/fakegpu/kernel_signatures.py\n",nm); abort(); }
  if(i<0){ fprintf(stderr,"[fake] SIGNATURE: kernel %s (family %s) has no parameter %s\n",nm,s->family,fkp_names[id]); abort(); }
  if((size_t)s->size[i]!=size){ fprintf(stderr,"[fake] SIGNATURE: kernel %s: parameter %d (%s %s) has %d bytes, read as %zu\n",nm,i,s->type[i],fkp_names[id],s->size[i],size); abort(); }
  return params[i]; }
#define ARG(type,name) (*(type*)fk_arg(nm,params,FKP_##name,sizeof(type)))
typedef struct { uintptr_t p; size_t n; int dev; } Alloc;
static const Alloc* alloc_of(uintptr_t p);
static void track(uintptr_t p,size_t n,int dev);
static void untrack(uintptr_t p,size_t n);
/* memory a copy may run later from: the fake's device allocations, pinned host memory, and
   what the nvshmem stand-in registers (fakegpu_track); anything else is pageable host memory */
static int fa_device(uintptr_t p){ return alloc_of(p)!=0; }
void fakegpu_track(uintptr_t p,size_t n,int dev){ track(p,n,dev); }

static void chk_stream(const char* what, void* s){
  if(s==0 || s==(void*)1 || s==(void*)2) return;
  void* sc=*(void**)s;
  if(sc!=g_cur) fprintf(stderr,"[fake] MISMATCH %s: stream %p belongs to ctx %p (dev %d) but current ctx is %p (dev %d)\n",what,s,sc,(int)((char*)sc-(char*)&g_ctx_dummy),g_cur,(int)((char*)g_cur-(char*)&g_ctx_dummy));
}
CUresult cuInit(unsigned f){return 0;}
CUresult cuDriverGetVersion(int* v){*v=13020;LOG("cuDriverGetVersion");return 0;}
CUresult cuDeviceGetCount(int* c){const char* g=getenv("FAKE_GPUS"); *c=g?atoi(g):2; return 0;} /* FAKE_GPUS=1: the lent machine */
CUresult cuDeviceGet(int* d,int o){*d=o;return 0;}
CUresult cuDeviceGetName(char* s,int len,int dev){snprintf(s,len,"NVIDIA FAKE H100");return 0;}
CUresult cuDeviceGetUuid(unsigned char* u,int dev){for(int i=0;i<16;i++)u[i]=i+dev;return 0;}
CUresult cuDeviceTotalMem(size_t* b,int d){*b=80ull<<30;return 0;}
CUresult cuDeviceGetAttribute(int* pi,int attr,int dev){
  switch(attr){case 1:*pi=1024;break; case 16:*pi=132;break; case 75:*pi=9;break; case 76:*pi=0;break; case 10:*pi=32;break; case 41:*pi=1;break; default:*pi=1;}
  LOG("cuDeviceGetAttribute(%d) -> %d",attr,*pi); return 0;}
CUresult cuDeviceGetPCIBusId(char* s,int len,int dev){LOG("cuDeviceGetPCIBusId len=%d dev=%d",len,dev);snprintf(s,len,"0000:%02X:00.0",dev+0x41);return 0;}
CUresult cuMemGetInfo(size_t* f,size_t* t){*f=1000;*t=2000;LOG("cuMemGetInfo ctx=%p",g_cur);return 0;}
CUresult cuDeviceCanAccessPeer(int* c,int a,int b){*c=(a!=b);return 0;}
CUresult cuCtxEnablePeerAccess(void* ctx,unsigned fl){return 704;}
CUresult cuDevicePrimaryCtxRetain(void** c,int d){*c=(char*)&g_ctx_dummy+d;return 0;}
CUresult cuDevicePrimaryCtxRelease(int d){return 0;}
CUresult cuCtxGetCurrent(void** c){*c=g_cur;return 0;}
CUresult cuCtxSetCurrent(void* c){if(c!=g_cur)LOG("cuCtxSetCurrent dev %d",(int)((char*)c-(char*)&g_ctx_dummy));g_cur=c;return 0;}
CUresult cuCtxPushCurrent(void* c){LOG("cuCtxPushCurrent");g_cur=c;return 0;}
CUresult cuCtxPopCurrent(void** c){if(c)*c=g_cur;return 0;}
CUresult cuCtxGetDevice(int* d){*d=(int)((char*)g_cur-(char*)&g_ctx_dummy);return 0;}
CUresult cuCtxSynchronize(void){LOG("cuCtxSynchronize"); if(fa_enabled()) fa_drain_all(); return 0;}
CUresult cuCtxGetStreamPriorityRange(int* l,int* g){*l=0;*g=-5;return 0;}
CUresult cuStreamCreateWithPriority(void** s,unsigned fl,int prio){FStream* st=calloc(1,sizeof(FStream)); st->ctx=g_cur; pthread_mutex_init(&st->q.mu,0); pthread_cond_init(&st->q.cv,0); st->q.nonblocking=(int)(fl&1); st->q.ctx=g_cur; fa_register(&st->q); *s=st;LOG("cuStreamCreateWithPriority flags=%u prio=%d",fl,prio);return 0;}
CUresult cuStreamDestroy(void* s){return 0;} /* queued work still runs (the queue is never freed) */
CUresult cuStreamSynchronize(void* s){LOG("cuStreamSynchronize %p (dev %d)",s,streamdev(s)); if(fa_enabled()) fa_drain(fa_queue(s)); return 0;}
CUresult cuStreamQuery(void* s){if(fa_enabled()){FQ* q=fa_queue(s); pthread_mutex_lock(&q->mu); int busy=q->done<q->queued; pthread_mutex_unlock(&q->mu); return busy?600:0;} return 0;}
CUresult cuStreamGetFlags(void* s,unsigned* f){*f=1;return 0;}
CUresult cuStreamGetPriority(void* s,int* p){*p=0;return 0;}
CUresult cuStreamGetCtx(void* s,void** c){*c=g_cur;return 0;}
CUresult cuStreamGetCtx_v2(void* s,void** c,void** g){*c=g_cur;if(g)*g=0;return 0;}
CUresult cuStreamGetDevice(void* s,int* d){*d=0;return 0;}
CUresult cuStreamWaitEvent(void* s,void* e,unsigned f){LOG("cuStreamWaitEvent stream=%p event=%p",s,e); FEvent* ev=e; if(fa_enabled() && ev->q) fa_wait_for(fa_queue(s),ev->q,ev->at); return 0;}
CUresult cuEventCreate(void** e,unsigned fl){*e=calloc(1,sizeof(FEvent));LOG("cuEventCreate flags=%u",fl);return 0;}
CUresult cuEventDestroy(void* e){return 0;}
CUresult cuEventRecord(void* e,void* s){chk_stream("cuEventRecord",s);LOG("cuEventRecord event=%p stream=%p",e,s); if(fa_enabled()){FQ* q=fa_queue(s); fa_implicit(q); ((FEvent*)e)->q=q; ((FEvent*)e)->at=fa_position(q);} return 0;}
CUresult cuEventSynchronize(void* e){FEvent* ev=e; if(fa_enabled() && ev->q) fa_drain_upto(ev->q,ev->at); return 0;}
CUresult cuEventQuery(void* e){FEvent* ev=e; if(fa_enabled()){ if(!ev->q) return 0; pthread_mutex_lock(&ev->q->mu); int busy=ev->q->done<ev->at; pthread_mutex_unlock(&ev->q->mu); return busy?600:0;} return 600;}
CUresult cuEventElapsedTime(float* ms,void* a,void* b){if(fa_enabled() && (cuEventQuery(a) || cuEventQuery(b))) return 600; /* NOT_READY, as CUDA */ *ms=1.25f;LOG("cuEventElapsedTime start=%p end=%p",a,b);return 0;}
CUresult cuMemAllocHost(void** p,size_t n){*p=calloc(1,n?n:1); track((uintptr_t)*p,n,-2);LOG("cuMemAllocHost %zu",n);return 0;}
CUresult cuMemFreeHost(void* p){LOG("cuMemFreeHost");return 0;}
CUresult cuMemAlloc(uintptr_t* p,size_t n){*p=(uintptr_t)calloc(1,n?n:1); track(*p,n,-3); return 0;}
CUresult cuMemFree(uintptr_t p){return 0;}
static int g_pools[4]; static int g_access[4][4];
/* Pools made by cuMemPoolCreate (cuda.core's IPC-enabled DeviceMemoryResource) or imported from
   another process's: a memfd mapped whole, allocations bumped from its start, so an importing
   process maps the same bytes. Default pools stay the g_pools entries. */
typedef struct { int magic, dev, fd, imported; char* base; size_t size, used; } Pool;
#define POOL_MAGIC 0x504f4f4c
static int is_made(void* p){ return !(p>=(void*)g_pools && p<(void*)(g_pools+4)) && ((Pool*)p)->magic==POOL_MAGIC; }
static int pooldev(void* p){ return is_made(p) ? ((Pool*)p)->dev : (int)((int*)(p)-g_pools); }
#define POOLIDX(p) pooldev(p)
static Pool* g_made[256]; static int g_nmade;
static Pool* pool_of(uintptr_t ptr){ for(int i=0;i<g_nmade;i++){ Pool* q=g_made[i]; if(q && ptr>=(uintptr_t)q->base && ptr<(uintptr_t)q->base+q->size) return q; } return 0; }
static Pool* pool_map(int fd,int dev,int imported){
  struct stat st; if(fstat(fd,&st)!=0 || st.st_size<=0) return 0;
  void* m=mmap(0,(size_t)st.st_size,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); if(m==MAP_FAILED) return 0;
  int slot=-1; for(int i=0;i<g_nmade;i++) if(!g_made[i]){slot=i;break;}  /* destroyed pools' slots */
  if(slot<0 && g_nmade<256) slot=g_nmade++;
  if(slot<0){ munmap(m,(size_t)st.st_size); fprintf(stderr,"[fake] more than 256 memory pools alive\n"); return 0; }
  Pool* q=calloc(1,sizeof(Pool)); q->magic=POOL_MAGIC; q->dev=dev; q->fd=fd; q->imported=imported; q->base=m; q->size=(size_t)st.st_size;
  g_made[slot]=q;
  return q; }
/* CUmemPoolProps: allocType, handleTypes, location{type,id}, win32 attrs, maxSize, usage */
typedef struct { int allocType, handleTypes, locType, locId; void* win32; size_t maxSize; unsigned short usage; } PoolProps;
CUresult cuMemPoolCreate(void** out,const PoolProps* pr){
  size_t n=pr->maxSize?pr->maxSize:(256u<<20); int fd=memfd_create("fake-cuda-pool",MFD_CLOEXEC);
  if(fd<0) return 2;
  Pool* q=ftruncate(fd,(off_t)n)==0 ? pool_map(fd,pr->locId,0) : 0;
  if(!q){ close(fd); return 2; }
  LOG("cuMemPoolCreate dev %d handleTypes=%d maxSize=%zu",pr->locId,pr->handleTypes,n); *out=q; return 0; }
CUresult cuMemPoolDestroy(void* p){ if(is_made(p)){ Pool* q=p; for(int i=0;i<g_nmade;i++) if(g_made[i]==q) g_made[i]=0; untrack((uintptr_t)q->base,q->size); munmap(q->base,q->size); close(q->fd); q->magic=0; free(q);} return 0; }
CUresult cuMemPoolTrimTo(void* p,size_t keep){ return 0; }
CUresult cuMemPoolExportToShareableHandle(void* h,void* p,int type,unsigned long long fl){
  if(!is_made(p) || type!=1) return 1;
  *(int*)h=fcntl(((Pool*)p)->fd,F_DUPFD_CLOEXEC,0); LOG("cuMemPoolExportToShareableHandle -> fd %d",*(int*)h); return *(int*)h<0?999:0; }
CUresult cuMemPoolImportFromShareableHandle(void** out,void* h,int type,unsigned long long fl){
  if(type!=1) return 1;
  int fd=fcntl((int)(intptr_t)h,F_DUPFD_CLOEXEC,0); Pool* q=fd<0?0:pool_map(fd,curdev(),1);
  if(!q){ if(fd>=0) close(fd); return 1; }
  LOG("cuMemPoolImportFromShareableHandle fd %d: %zu bytes",(int)(intptr_t)h,q->size); *out=q; return 0; }
static int pool_alloc(uintptr_t* out,size_t n,void* p){
  Pool* q=p; size_t at=(q->used+511)&~(size_t)511; if(at+(n?n:1)>q->size) return 2;
  q->used=at+(n?n:1); *out=(uintptr_t)q->base+at; return 0; }
static int curdev(void){ if(fa_launch_dev>=0) return fa_launch_dev; return (int)((char*)g_cur-(char*)&g_ctx_dummy);}
static int streamdev(void* s){ if(s==0||s==(void*)1||s==(void*)2) return curdev(); return (int)((char*)*(void**)s-(char*)&g_ctx_dummy);}
CUresult cuDeviceGetMemPool(void** p,int d){*p=&g_pools[d];return 0;}
CUresult cuDeviceGetDefaultMemPool(void** p,int d){*p=&g_pools[d];return 0;}
CUresult cuMemGetMemPool(void** p,void* loc,int t){*p=&g_pools[((int*)loc)[1]];return 0;}
CUresult cuMemPoolGetAttribute(void* p,int a,void* v){memset(v,0,8);return 0;}
CUresult cuMemPoolSetAttribute(void* p,int a,void* v){return 0;}
CUresult cuMemPoolGetAccess(int* f,void* p,void* loc){int id=((int*)loc)[1]; *f = (id==POOLIDX(p))?3:g_access[POOLIDX(p)][id]; return 0;}

static Alloc g_allocs[100000]; static int g_na;
/* the registry is read by stream workers too (FAKE_ASYNC): one lock */
static pthread_mutex_t g_allocs_mu = PTHREAD_MUTEX_INITIALIZER;
static void track(uintptr_t p,size_t n,int dev){ pthread_mutex_lock(&g_allocs_mu);
  if(g_na<100000){g_allocs[g_na].p=p;g_allocs[g_na].n=n?n:1;g_allocs[g_na].dev=dev;g_na++;}
  else { static int said; if(!said++) fprintf(stderr,"[fake] more than 100000 allocations: later ones are not tracked\n"); }
  pthread_mutex_unlock(&g_allocs_mu); }
/* memory unmapped (a destroyed pool, a finalized heap): a later mapping at the same address
   is someone else's */
static void untrack(uintptr_t p,size_t n){ pthread_mutex_lock(&g_allocs_mu);
  for(int i=0;i<g_na;i++) if(g_allocs[i].p>=p && g_allocs[i].p<p+n) g_allocs[i].n=0;
  pthread_mutex_unlock(&g_allocs_mu); }
void fakegpu_untrack(uintptr_t p,size_t n){ untrack(p,n); }
static const Alloc* alloc_of(uintptr_t p){ const Alloc* a=0; pthread_mutex_lock(&g_allocs_mu);
  for(int i=g_na-1;i>=0;i--) if(p>=g_allocs[i].p && p<g_allocs[i].p+g_allocs[i].n){ a=&g_allocs[i]; break; }
  pthread_mutex_unlock(&g_allocs_mu); return a; }
static int owner(uintptr_t p){ const Alloc* a=alloc_of(p); return a?a->dev:-1; }
/* CUmemPoolPtrExportData (64 bytes): the allocation's offset in its pool and its size */
typedef struct { unsigned magic; unsigned pad; uint64_t off, size; unsigned char rest[40]; } PtrExport;
CUresult cuMemPoolExportPointer(PtrExport* d,uintptr_t ptr){
  Pool* q=pool_of(ptr); const Alloc* a=alloc_of(ptr); if(!q || !a || a->p!=ptr) return 1;
  memset(d,0,sizeof *d); d->magic=POOL_MAGIC; d->off=ptr-(uintptr_t)q->base; d->size=a->n; return 0; }
CUresult cuMemPoolImportPointer(uintptr_t* out,void* p,PtrExport* d){
  if(!is_made(p) || d->magic!=POOL_MAGIC || d->off+d->size>((Pool*)p)->size) return 1;
  *out=(uintptr_t)((Pool*)p)->base+d->off; track(*out,d->size,((Pool*)p)->dev); return 0; }
/* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (11) and _RANGE_SIZE (12): the tracked allocation */
static int range_attr(int attr,void* data,uintptr_t p){
  const Alloc* a=alloc_of(p); if(attr==11){*(uintptr_t*)data=a?a->p:0; return 1;}
  if(attr==12){*(size_t*)data=a?a->n:0; return 1;} return 0; }
static void chk_access(const char* what, uintptr_t p, int dev){ int o=owner(p); if(o>=0 && o!=dev && g_access[o][dev]==0) fprintf(stderr,"[fake] PEERFAULT %s: kernel on dev %d touches dev %d pool memory %p without pool access\n",what,dev,o,(void*)p); }
CUresult cuMemAllocFromPoolAsync(uintptr_t* p,size_t n,void* pool,void* s){chk_stream("cuMemAllocFromPoolAsync",s); if(POOLIDX(pool)!=streamdev(s)) fprintf(stderr,"[fake] MISMATCH cuMemAllocFromPoolAsync: pool of dev %d on a stream of dev %d\n",POOLIDX(pool),streamdev(s));if(is_made(pool)){ if(pool_alloc(p,n,pool)) return 2; } else *p=(uintptr_t)calloc(1,n?n:1); track(*p,n,POOLIDX(pool));LOG("cuMemAllocFromPoolAsync %zu",n);return 0;}
CUresult cuMemAllocAsync(uintptr_t* p,size_t n,void* s){*p=(uintptr_t)calloc(1,n?n:1); track(*p,n,-3); return 0;}
CUresult cuMemFreeAsync(uintptr_t p,void* s){LOG("cuMemFreeAsync stream=%p (dev %d)",s,streamdev(s));return 0;}
CUresult cuMemcpyAsync(uintptr_t d,uintptr_t s,size_t n,void* st){LOG("cuMemcpyAsync dst=%p src=%p n=%zu stream=%p (dev %d)",(void*)d,(void*)s,n,st,streamdev(st));if(fa_enabled()){ FQ* q=fa_queue(st);
    const Alloc *ad=alloc_of(d), *as=alloc_of(s);
    if(ad && as && !(ad->dev==-2 && as->dev==-2)){ FOp* op=calloc(1,sizeof(FOp)); op->kind=1; op->dst=d; op->src=s; op->n=n; fa_enqueue(st,op); return 0; }
    fa_implicit(q); fa_drain(q); } /* pageable or host-to-host: the stream first, then the copy, in the call (as CUDA) */
  memcpy((void*)d,(void*)s,n);return 0;}
CUresult cuMemsetD8Async(uintptr_t d,unsigned char v,size_t n,void* s){if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=2; op->dst=d; op->v=(unsigned)v; op->w=n; op->h=1; op->pitch=0; op->width=1; fa_enqueue(s,op); return 0; } memset((void*)d,v,n);LOG("cuMemsetD8Async v=0x%x n=%zu",v,n);return 0;}
CUresult cuMemsetD16Async(uintptr_t d,unsigned short v,size_t n,void* s){if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=2; op->dst=d; op->v=(unsigned)v; op->w=n; op->h=1; op->pitch=0; op->width=2; fa_enqueue(s,op); return 0; } for(size_t i=0;i<n;i++)((unsigned short*)d)[i]=v;LOG("cuMemsetD16Async v=0x%x n=%zu",v,n);return 0;}
CUresult cuMemsetD2D32Async(uintptr_t d,size_t pitch,unsigned v,size_t w,size_t h,void* s){if(pitch<w*4 || (d&3)) return 1; if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=2; op->dst=d; op->v=v; op->w=w; op->h=h; op->pitch=pitch; op->width=4; fa_enqueue(s,op); return 0; } 
  LOG("cuMemsetD2D32Async d=%p pitch=%zu v=0x%x w=%zu h=%zu",(void*)d,pitch,v,w,h);
  if(pitch<w*4 || (d&3)) return 1;
  for(size_t r=0;r<h;r++) for(size_t i=0;i<w;i++) ((unsigned*)(d+r*pitch))[i]=v; return 0;}
CUresult cuMemsetD32Async(uintptr_t d,unsigned v,size_t n,void* s){if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=2; op->dst=d; op->v=(unsigned)v; op->w=n; op->h=1; op->pitch=0; op->width=4; fa_enqueue(s,op); return 0; } for(size_t i=0;i<n;i++)((unsigned*)d)[i]=v;LOG("cuMemsetD32Async v=0x%x n=%zu",v,n);return 0;}
CUresult cuMemcpy2DAsync(const void* p,void* s){return 0;}
CUresult cuPointerGetAttributes(unsigned n,int* attrs,void** data,uintptr_t p){
  for(unsigned i=0;i<n;i++){ if(range_attr(attrs[i],data[i],p)) continue; if(attrs[i]==2)*(unsigned*)data[i]=2; else if(attrs[i]==9)*(int*)data[i]=0; else memset(data[i],0,4);} return 0;}
CUresult cuGetErrorString(int e,const char** p){*p="fake error";return 0;}
CUresult cuGetErrorName(int e,const char** p){*p="FAKE";return 0;}
static int g_lib;
typedef struct { char name[128]; } FKern;
static FKern g_kerns[1024]; static int g_nk;  /* (64 overflowed: the project has more kernels) */
CUresult cuLibraryLoadData(void** lib,const void* code,void* a,void* b,unsigned c,void* d,void* e,unsigned f){*lib=&g_lib;LOG("cuLibraryLoadData");return 0;}
CUresult cuLibraryUnload(void* l){return 0;}
CUresult cuLibraryGetKernel(void** k,void* lib,const char* name){
  for(int i=0;i<g_nk;i++) if(!strcmp(g_kerns[i].name,name)){*k=&g_kerns[i];LOG("cuLibraryGetKernel %s (again)",name);return 0;}
  if(g_nk>=1024){ fprintf(stderr,"[fake] more than 1024 kernels\n"); return 1; }
  snprintf(g_kerns[g_nk].name,128,"%s",name); *k=&g_kerns[g_nk++]; LOG("cuLibraryGetKernel %s",name); return 0;}
CUresult cuKernelGetFunction(void** f,void* k){*f=k;return 0;}
/* element size of the dtype token at the start of dt ("int8_op", "bfloat16_to_float32_sum") */
static int tok(const char* dt, const char* name){ size_t n=strlen(name); return !strncmp(dt,name,n) && dt[n]=='_'; }
static int fake_es(const char* dt){
  if(tok(dt,"complex128")) return 16;
  if(tok(dt,"complex64")||tok(dt,"float64")||tok(dt,"int64")||tok(dt,"uint64")) return 8;
  if(tok(dt,"float16")||tok(dt,"bfloat16")||tok(dt,"int16")||tok(dt,"uint16")) return 2;
  if(tok(dt,"float8_e4m3")||tok(dt,"float8_e5m2")||tok(dt,"int8")||tok(dt,"uint8")||tok(dt,"bool")) return 1;
  return 4; }
#include "fake_attention.h"
static uint64_t now_ns(void){ struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return (uint64_t)t.tv_sec*1000000000ull+(uint64_t)t.tv_nsec; }
/* a spinning "kernel" sleeps a little: ranks may outnumber the cores, and the rank it waits for needs one */
static void spin_pause(void){ struct timespec t={0,20000}; nanosleep(&t,0); }
#include "fake_collectives.h"
CUresult cuLaunchKernelEx(const CUlaunchConfig* c,void* f,void** params,void** extra){chk_stream("cuLaunchKernelEx",c->hStream);
  if(!params){LOG("  NO PARAMS");return 1;}
  if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=0; op->cfg=*c; op->f=f; op->dev=streamdev(c->hStream); fa_copy_params(op,params); fa_enqueue(c->hStream,op); return 0; }
  return run_kernel(c,f,params);}
static CUresult run_kernel(const CUlaunchConfig* c,void* f,void** params){
  const char* nm = ((FKern*)f)->name;
  LOG("cuLaunchKernelEx %s grid=(%u,%u,%u) block=(%u,%u,%u) shm=%u nattrs=%u stream=%p dev=%d",nm,c->gx,c->gy,c->gz,c->bx,c->by,c->bz,c->shm,c->nattrs,c->hStream,streamdev(c->hStream));
  if(!params){LOG("  NO PARAMS");return 1;}
  if(!strcmp(nm,"shmem_strided_copy")){
    char* dst=ARG(char*,dst); const char* src=ARG(const char*,src);
    unsigned long long n=ARG(unsigned long long,n); int rank=ARG(int,rank); int es=ARG(int,elem_size);
    const long long* meta=ARG(const long long*,meta);
    LOG("  strided_copy dst=%p src=%p n=%llu rank=%d elem=%d meta=%p",dst,src,n,rank,es,meta); { int dv=streamdev(c->hStream); chk_access("dst",(uintptr_t)dst,dv); chk_access("src",(uintptr_t)src,dv); chk_access("meta",(uintptr_t)meta,dv);} 
    for(int d=0; d<3*rank; d++) LOG("    meta[%d]=%lld",d,meta[d]);
    for(unsigned long long i=0;i<n;i++){ long long rem=(long long)i, doff=0, soff=0;
      for(int d=rank-1;d>=0;--d){ long long ext=meta[d], idx=rem%ext; rem/=ext; doff+=idx*meta[rank+d]; soff+=idx*meta[2*rank+d]; }
      memcpy(dst+doff, src+soff, es); }
  } else if(!strcmp(nm,"saxpy")){
    float a=ARG(float,a); const float* x=ARG(const float*,x); float* y=ARG(float*,y); unsigned long long n=ARG(unsigned long long,n);
    LOG("  saxpy a=%g x=%p y=%p n=%llu",a,x,y,n);
    unsigned long long total=(unsigned long long)c->gx*c->gy*c->gz*c->bx*c->by*c->bz;
    for(unsigned long long i=0;i<n && i<total;i++) y[i]=a*x[i]+y[i];
  } else if(!strcmp(nm,"block_ids")){
    int* out=ARG(int*,out);
    for(unsigned z=0;z<c->gz;z++)for(unsigned y=0;y<c->gy;y++)for(unsigned x=0;x<c->gx;x++){int b=x+c->gx*(y+c->gy*z); out[b]=b;}
  } else if(!strcmp(nm,"shmem_signal")){
    uint64_t* f=ARG(uint64_t*,flag); uint64_t v=ARG(uint64_t,value); int op=ARG(int,op);
    LOG("  signal %p op=%d v=%llu",(void*)f,op,(unsigned long long)v); if(op==0)__atomic_store_n(f,v,__ATOMIC_RELEASE); else __atomic_fetch_add(f,v,__ATOMIC_ACQ_REL);
  } else if(!strcmp(nm,"shmem_wait_until")){
    /* as the kernel: spin (another process may raise the flag) until it holds or timeout_ns */
    /* signal words are uint64, compared unsigned (as the kernel) */
    uint64_t* f=ARG(uint64_t*,flag); int cmp=ARG(int,cmp); uint64_t val=ARG(uint64_t,value); uint64_t tmo=ARG(uint64_t,timeout_ns); long long* res=ARG(long long*,result);
    uint64_t t0=now_ns(); uint64_t v; int ok;
    for(;;){ v=__atomic_load_n(f,__ATOMIC_ACQUIRE); ok = cmp==0? v==val : cmp==1? v!=val : cmp==2? v>val : cmp==3? v>=val : cmp==4? v<val : v<=val;
      if(ok || now_ns()-t0>tmo) break; spin_pause(); }
    res[0]=(long long)v; res[1]=ok; LOG("  wait_until v=%llu cmp=%d val=%llu ok=%d",(unsigned long long)v,cmp,(unsigned long long)val,ok);
  } else if(!strcmp(nm,"shmem_barrier")){
    uint64_t** pads=ARG(uint64_t**,pads); int rank=ARG(int,rank); int size=ARG(int,size); uint64_t ep=ARG(uint64_t,epoch); uint64_t tmo=ARG(uint64_t,timeout_ns); long long* res=ARG(long long*,result);
    int round=0; res[0]=-1; res[1]=0;
    for(int d=1; d<size; d<<=1, ++round){ __atomic_store_n(&pads[(rank+d)%size][round],ep,__ATOMIC_RELEASE); uint64_t t0=now_ns(), v;
      while((v=__atomic_load_n(&pads[rank][round],__ATOMIC_ACQUIRE))<ep){ if(now_ns()-t0>tmo){res[0]=round;res[1]=(long long)v;break;} spin_pause(); }
      if(res[0]>=0) break; }
    LOG("  barrier rank=%d size=%d epoch=%llu -> %lld",rank,size,(unsigned long long)ep,res[0]);
  } else if(!strcmp(nm,"shmem_atomic")){
    void* t=ARG(void*,target); int w=ARG(int,width); int op=ARG(int,op); uint64_t v=ARG(uint64_t,value), cmpv=ARG(uint64_t,compare); uint64_t* old=ARG(uint64_t*,old);
    /* atomic across the processes that map the same heap */
    if(w==8){uint64_t* p=t; uint64_t prev; if(op==0)prev=__atomic_fetch_add(p,v,__ATOMIC_ACQ_REL); else if(op==1)prev=__atomic_exchange_n(p,v,__ATOMIC_ACQ_REL); else {prev=cmpv; __atomic_compare_exchange_n(p,&prev,v,0,__ATOMIC_ACQ_REL,__ATOMIC_ACQUIRE);} *old=prev;}
    else {uint32_t* p=t; uint32_t prev; if(op==0)prev=__atomic_fetch_add(p,(uint32_t)v,__ATOMIC_ACQ_REL); else if(op==1)prev=__atomic_exchange_n(p,(uint32_t)v,__ATOMIC_ACQ_REL); else {prev=(uint32_t)cmpv; __atomic_compare_exchange_n(p,&prev,(uint32_t)v,0,__ATOMIC_ACQ_REL,__ATOMIC_ACQUIRE);} *old=prev;}
    LOG("  atomic w=%d op=%d -> old=%llu",w,op,(unsigned long long)*old);
  } else if(!strncmp(nm,"allreduce_one_shot_",19) || !strncmp(nm,"allreduce_two_shot_",19)){
    int two = nm[10]=='t';
    char* in=ARG(char*,input); char** scratch=ARG(char**,scratch); char** results= two? ARG(char**,results) : 0;
    char* out=ARG(char*,out); unsigned long long n=ARG(unsigned long long,n); double scale=ARG(double,scale);
    int opk = strlen(nm)>3 && !strcmp(nm+strlen(nm)-3,"_op"); int op = opk ? ARG(int,op) : -1;
    uint64_t** flags=ARG(uint64_t**,flags); unsigned* arrive=ARG(unsigned*,arrive); unsigned base=ARG(unsigned,arrive_base);
    uint64_t stage0=ARG(uint64_t,stage0); int* status=ARG(int*,status); int rank=ARG(int,rank); int size=ARG(int,size);
    const char* dt=nm+19; int wide = strstr(nm,"_to_float32")!=0;
    int es = fake_es(dt);
    unsigned stages = two?3:2;
    uint64_t* epoch=(uint64_t*)(arrive+2); if(stage0==0) stage0=*epoch+1; /* device-side stages */
    LOG("  allreduce %s n=%llu es=%d op=%d rank=%d size=%d stage0=%llu base=%u arrive=%u",nm,n,es,op,rank,size,(unsigned long long)stage0,base,*arrive);
    if(opk && (op<0 || op>7)) fprintf(stderr,"[fake] OPCODE %d out of range\n",op);
    if(size!=1){ fake_collective(nm,params); return 0; } /* fake_collectives.h */
    if(*arrive!=0 || base!=0) fprintf(stderr,"[fake] ARRIVE MISMATCH: counter %u, host base %u (both 0: device-side stages)\n",*arrive,base);
    if(flags[0][0] < stage0-1){ *status=1; fprintf(stderr,"[fake] ENTRY: flag %llu < stage0-1 %llu\n",(unsigned long long)flags[0][0],(unsigned long long)(stage0-1)); return 0; }
    if(in!=scratch[0]) memcpy(scratch[0],in,n*es);
    if(wide || scale!=1.0){ /* one rank: out = x * scale, rounded once to the output type */
      int di = !strncmp(dt,"bfloat16",8) ? 2 : !strncmp(dt,"float16",7) ? 1 : !strncmp(dt,"float64",7) ? 8 : 4;
      memcpy(scratch[0],in,n*es);
      for(unsigned long long i=0;i<n;i++) fa_store(out,i,fa_load(scratch[0],i,di)*(di==8?scale:(double)(float)scale),wide?4:di);
    } else if(two){ memcpy(results[0],scratch[0],n*es); memcpy(out,results[0],n*es);} else memcpy(out,scratch[0],n*es);
    flags[0][0]=stage0+stages-1; *epoch=stage0+stages-1; /* the counter ends at 0, as the kernel's */
  } else if(!strncmp(nm,"family_",7) || !strncmp(nm,"reduce_scatter_",15)){
    /* one rank: every part is this rank's own; the stage bookkeeping as the real kernel */
    int rs = nm[0]=='r'; int bc = !strcmp(nm,"family_broadcast"); int a2a = !strcmp(nm,"family_all_to_all");
    char* in=ARG(char*,input); char** scratch=ARG(char**,scratch); char* out=ARG(char*,out);
    unsigned long long n= rs ? ARG(unsigned long long,n) : ARG(unsigned long long,nbytes); unsigned long long lo=0, hi=0, stride=0; int root=0;
    if(rs){ lo=ARG(unsigned long long,lo); hi=ARG(unsigned long long,hi); if(!strcmp(nm+strlen(nm)-3,"_op")){ int op=ARG(int,op); if(op<0||op>7) fprintf(stderr,"[fake] OPCODE %d out of range\n",op);} }
    else if(bc) root=ARG(int,root); else stride=ARG(unsigned long long,stride);
    uint64_t** flags=ARG(uint64_t**,flags); unsigned* arrive=ARG(unsigned*,arrive); unsigned base=ARG(unsigned,arrive_base);
    uint64_t stage0=ARG(uint64_t,stage0); int* status=ARG(int*,status); int rank=ARG(int,rank); int size=ARG(int,size);
    uint64_t* epoch=(uint64_t*)(arrive+2); if(stage0==0) stage0=*epoch+1;
    LOG("  %s n=%llu lo=%llu hi=%llu stride=%llu root=%d rank=%d size=%d stage0=%llu",nm,n,lo,hi,stride,root,rank,size,(unsigned long long)stage0);
    if(size!=1){ fake_collective(nm,params); return 0; } /* fake_collectives.h */
    if(*arrive!=0 || base!=0) fprintf(stderr,"[fake] ARRIVE MISMATCH: counter %u, host base %u (both 0: device-side stages)\n",*arrive,base);
    if(flags[0][0] < stage0-1){ *status=1; fprintf(stderr,"[fake] ENTRY: flag %llu < stage0-1 %llu\n",(unsigned long long)flags[0][0],(unsigned long long)(stage0-1)); return 0; }
    if(rs){ const char* dt=nm+15; int es = fake_es(dt);
      memcpy(scratch[0],in,n*es); if(hi>lo) memcpy(out,scratch[0]+lo*es,(hi-lo)*es); }
    else { memcpy(scratch[0],in,n); memcpy(out,scratch[0],n); (void)a2a; }
    flags[0][0]=stage0+1; *epoch=stage0+1;
  } else if(!strcmp(nm,"allreduce_drain") && ARG(int,size)!=1){ fake_collective(nm,params);
  } else if(!strcmp(nm,"allreduce_drain")){
    uint64_t** flags=ARG(uint64_t**,flags); unsigned* arrive=ARG(unsigned*,arrive); uint64_t stage0=ARG(uint64_t,stage0); int* status=ARG(int*,status);
    if(stage0==0) stage0=*(uint64_t*)(arrive+2)+1;
    if(flags[0][0] < stage0-1){*status=1; fprintf(stderr,"[fake] DRAIN: flag %llu < %llu\n",(unsigned long long)flags[0][0],(unsigned long long)(stage0-1));}
  } else if(fake_reduce_local(nm,params)){
  } else if(fake_attention(nm,c->gx,c->gy,c->gz,params)){
  } else LOG("  unknown kernel, not emulated");
  return 0;}

CUresult cuStreamIsCapturing(void* s,int* st){*st=0;return 0;}
CUresult cuStreamGetCaptureInfo(void* s,int* st,unsigned long long* id,void** g,void** deps,void** ed,size_t* n){if(st)*st=0;return 0;}
CUresult cuPointerGetAttribute(void* data,int attr,uintptr_t p){if(!range_attr(attr,data,p))memset(data,0,8);return 0;}
CUresult cuKernelGetAttribute(int* pi,int attr,void* k,int dev){*pi=attr==0?1024:0;return 0;}
CUresult cuKernelGetParamInfo(void* k,size_t idx,size_t* off,size_t* sz){if(idx>=3)return 1; *off=idx*8; *sz=8; return 0;}
CUresult cuKernelGetParamCount(void* k,size_t* n){*n=3;return 0;}
CUresult cuMemGetDefaultMemPool(void** p,void* loc,int t){*p=&g_pools[((int*)loc)[1]];return 0;}
CUresult cuMemPoolSetAccess(void* p,void* d,size_t n){const int* a=(const int*)d; for(size_t i=0;i<n;i++){ LOG("cuMemPoolSetAccess pool of dev %d: dev %d gets flags=%d (loc.type=%d)",POOLIDX(p),a[3*i+1],a[3*i+2],a[3*i]); g_access[POOLIDX(p)][a[3*i+1]]=a[3*i+2]; } return 0;}
CUresult cuLibraryGetModule(void** m,void* l){*m=l;return 0;}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n,void* f,int bs,size_t shm){*n=2048/bs;LOG("cuOccupancyMaxActiveBlocksPerMultiprocessor bs=%d -> %d",bs,*n);return 0;}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n,void* f,int bs,size_t shm,unsigned fl){*n=2048/bs;return 0;}
CUresult cuCtxDisablePeerAccess(void* c){return 0;}
struct E{const char*n;void*f;};
#define X(n) {#n, n}
static struct E T[]={X(cuInit),X(cuDriverGetVersion),X(cuDeviceGetCount),X(cuDeviceGet),X(cuDeviceGetName),X(cuDeviceGetUuid),X(cuDeviceTotalMem),
X(cuDeviceGetAttribute),X(cuDeviceGetPCIBusId),X(cuMemGetInfo),X(cuDeviceCanAccessPeer),X(cuCtxEnablePeerAccess),X(cuDevicePrimaryCtxRetain),
X(cuDevicePrimaryCtxRelease),X(cuCtxGetCurrent),X(cuCtxSetCurrent),X(cuCtxPushCurrent),X(cuCtxPopCurrent),X(cuCtxGetDevice),X(cuCtxSynchronize),
X(cuCtxGetStreamPriorityRange),X(cuStreamCreateWithPriority),X(cuStreamDestroy),X(cuStreamSynchronize),X(cuStreamQuery),X(cuStreamGetFlags),
X(cuStreamGetPriority),X(cuStreamGetCtx),X(cuStreamGetCtx_v2),X(cuStreamGetDevice),X(cuStreamWaitEvent),X(cuEventCreate),X(cuEventDestroy),
X(cuEventRecord),X(cuEventSynchronize),X(cuEventQuery),X(cuEventElapsedTime),{"cuEventElapsedTime_v2",cuEventElapsedTime},X(cuMemAllocHost),X(cuMemFreeHost),
X(cuMemAlloc),X(cuMemFree),X(cuDeviceGetMemPool),X(cuDeviceGetDefaultMemPool),X(cuMemGetMemPool),X(cuMemPoolGetAttribute),X(cuMemPoolSetAttribute),
X(cuMemPoolGetAccess),X(cuMemAllocFromPoolAsync),X(cuMemAllocAsync),X(cuMemFreeAsync),X(cuMemcpyAsync),X(cuMemsetD8Async),X(cuMemsetD16Async),
X(cuMemsetD32Async),X(cuMemsetD2D32Async),X(cuMemcpy2DAsync),X(cuPointerGetAttributes),X(cuGetErrorString),X(cuGetErrorName),X(cuLibraryLoadData),X(cuLibraryUnload),
X(cuLibraryGetKernel),X(cuKernelGetFunction),X(cuLaunchKernelEx),X(cuStreamIsCapturing),X(cuStreamGetCaptureInfo),X(cuPointerGetAttribute),X(cuKernelGetAttribute),X(cuKernelGetParamInfo),X(cuKernelGetParamCount),X(cuMemGetDefaultMemPool),X(cuMemPoolSetAccess),X(cuLibraryGetModule),X(cuOccupancyMaxActiveBlocksPerMultiprocessor),X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags),X(cuCtxDisablePeerAccess),X(cuMemPoolCreate),X(cuMemPoolDestroy),X(cuMemPoolTrimTo),X(cuMemPoolExportToShareableHandle),X(cuMemPoolImportFromShareableHandle),X(cuMemPoolExportPointer),X(cuMemPoolImportPointer),{0,0}};
CUresult cuGetProcAddress_v2(const char* sym,void** pfn,int ver,uint64_t flags,int* st){
  for(int i=0;T[i].n;i++) if(!strcmp(T[i].n,sym)){*pfn=T[i].f; if(st)*st=0; return 0;}
  if(getenv("FAKE_MISS")) fprintf(stderr,"[fake] MISSING %s\n",sym);
  *pfn=0; if(st)*st=1; return 500;}
CUresult cuGetProcAddress(const char* sym,void** pfn,int ver,uint64_t flags){return cuGetProcAddress_v2(sym,pfn,ver,flags,0);}
CUresult cuGetExportTable(const void** tbl, const void* uuid){LOG("cuGetExportTable -> not supported"); if(tbl)*tbl=0; return 801;}
