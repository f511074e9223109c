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
/* Kernels run from their own source on the CPU (cudacpu/README.md): a cubin given to
   cuLibraryLoadData is looked up among the sources the recording NVRTC saw (fake_nvrtc.c,
   FAKE_KERNEL_SOURCES), that source is built for the CPU, and launches run it. */
#include "cudacpu/cudacpu_api.h"
#include "fake_cubin.h"
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
/* multiprocessors the fake reports (FAKE_SMS, default 4): grids stay small on the CPU */
static int fake_sms(void){ const char* s=getenv("FAKE_SMS"); int n=s&&*s?atoi(s):4; return n>0?n:1; }
CUresult cuInit(unsigned f){return 0;}
CUresult cuDriverGetVersion(int* v){*v=13020;LOG("cuDriverGetVersion");return 0;}
CUresult cuDeviceGetCount(int* c){const char* g=getenv("FAKE_GPUS"); *c=g?atoi(g):2; return 0;} /* FAKE_GPUS=1: the lent machine */
CUresult cuDeviceGet(int* d,int o){*d=o;return 0;}
CUresult cuDeviceGetName(char* s,int len,int dev){snprintf(s,len,"NVIDIA FAKE H100");return 0;}
CUresult cuDeviceGetUuid(unsigned char* u,int dev){for(int i=0;i<16;i++)u[i]=i+dev;return 0;}
CUresult cuDeviceTotalMem(size_t* b,int d){*b=80ull<<30;return 0;}
CUresult cuDeviceGetAttribute(int* pi,int attr,int dev){
  switch(attr){case 1:*pi=1024;break; case 16:*pi=fake_sms();break; case 75:*pi=9;break; case 76:*pi=0;break; case 10:*pi=32;break; case 41:*pi=1;break; default:*pi=1;}
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
/* a host function in stream order (the NVSHMEM stand-in's network operations, fake_nvshmem.c) */
CUresult cuLaunchHostFunc(void* s,void (*fn)(void*),void* data){chk_stream("cuLaunchHostFunc",s);LOG("cuLaunchHostFunc stream=%p",s);
  if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=4; op->fn=fn; op->data=data; fa_enqueue(s,op); return 0; }
  fn(data); return 0;}
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
/* a library: the CPU build of the cubin's source */
typedef struct { cudacpu_module* m; char key[33]; } FLib;
typedef struct { char name[128]; cudacpu_kernel* k; } FKern;
static FKern g_kerns[4096]; static int g_nk; static pthread_mutex_t g_kerns_mu = PTHREAD_MUTEX_INITIALIZER;
static char* slurp(const char* path, size_t* n){ FILE* f=fopen(path,"rb"); if(!f) return 0;
  fseek(f,0,SEEK_END); long len=ftell(f); rewind(f); char* b=malloc((size_t)len+1);
  size_t got=fread(b,1,(size_t)len,f); fclose(f); b[got]=0; if(n)*n=got; return b; }
CUresult cuLibraryLoadData(void** lib,const void* code,void* a,void* b,unsigned c,void* d,void* e,unsigned f){
  size_t n=fake_elf_extent(code);
  if(!n){ fprintf(stderr,"[fake] cuLibraryLoadData: the image is not an ELF cubin\n"); return 200; } /* CUDA_ERROR_INVALID_IMAGE */
  FLib* L=calloc(1,sizeof *L); fake_cubin_key(code,n,L->key);
  const char* dir=getenv("FAKE_KERNEL_SOURCES"); char path[4096]; size_t len=0;
  snprintf(path,sizeof path,"%s/%s.cu",dir?dir:"",L->key); char* src=dir?slurp(path,&len):0;
  snprintf(path,sizeof path,"%s/%s.opts",dir?dir:"",L->key); char* opts=dir?slurp(path,0):0;
  if(!src || !opts){ fprintf(stderr,"[fake] cuLibraryLoadData: no source recorded for cubin %s in FAKE_KERNEL_SOURCES=%s: "
      "it was compiled without the recording NVRTC (tests/fakegpu/fake_nvrtc.c); use a kernel cache that it filled\n",L->key,dir?dir:"(unset)");
    free(src); free(opts); free(L); return 200; }
  char err[16384]; L->m=cudacpu_load(src,len,opts,err,sizeof err); free(src); free(opts);
  if(!L->m){ fprintf(stderr,"[fake] cuLibraryLoadData: the CPU build of cubin %s failed: %s\n",L->key,err); free(L); return 200; }
  LOG("cuLibraryLoadData %s",L->key); *lib=L; return 0;}
CUresult cuLibraryUnload(void* l){return 0;} /* (the CPU build stays loaded: kernels may still be queued) */
CUresult cuLibraryGetKernel(void** k,void* lib,const char* name){
  cudacpu_kernel* ck=cudacpu_kernel_of(((FLib*)lib)->m,name);
  if(!ck){ LOG("cuLibraryGetKernel %s: not in the library",name); return 500; } /* CUDA_ERROR_NOT_FOUND */
  pthread_mutex_lock(&g_kerns_mu);
  for(int i=0;i<g_nk;i++) if(g_kerns[i].k==ck){*k=&g_kerns[i]; pthread_mutex_unlock(&g_kerns_mu); return 0;}
  if(g_nk>=4096){ pthread_mutex_unlock(&g_kerns_mu); fprintf(stderr,"[fake] more than 4096 kernels\n"); return 2; }
  snprintf(g_kerns[g_nk].name,128,"%s",name); g_kerns[g_nk].k=ck; *k=&g_kerns[g_nk++];
  pthread_mutex_unlock(&g_kerns_mu); LOG("cuLibraryGetKernel %s",name); return 0;}
CUresult cuKernelGetFunction(void** f,void* k){*f=k;return 0;}
/* CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value; CU_LAUNCH_ATTRIBUTE_COOPERATIVE is 2 */
static int cooperative_of(const CUlaunchConfig* c){ for(unsigned i=0;i<c->nattrs;i++){ const char* a=(const char*)c->attrs+72*(size_t)i;
    if(*(const int*)a==2) return *(const int*)(a+8); } return 0; }
static CUresult check_launch(const CUlaunchConfig* c,void* f){
  cudacpu_dim3 g={c->gx,c->gy,c->gz}, b={c->bx,c->by,c->bz}; char err[1024];
  int rc=cudacpu_check(((FKern*)f)->k,g,b,c->shm,cooperative_of(c),fake_sms(),err,sizeof err);
  if(rc) fprintf(stderr,"[fake] launch refused: %s\n",err);
  return rc; }
CUresult cuLaunchKernelEx(const CUlaunchConfig* c,void* f,void** params,void** extra){chk_stream("cuLaunchKernelEx",c->hStream);
  if(!params){LOG("  NO PARAMS");return 1;}
  CUresult rc=check_launch(c,f); if(rc) return rc;
  if(fa_enabled()){ FOp* op=calloc(1,sizeof(FOp)); op->kind=0; op->cfg=*c; op->f=f; op->dev=streamdev(c->hStream);
    size_t sizes[FA_SLOTS]; int n=cudacpu_params(((FKern*)f)->k,sizes,FA_SLOTS);
    if(n>FA_SLOTS){ fprintf(stderr,"[fake] %s: more than %d parameters\n",((FKern*)f)->name,FA_SLOTS); free(op); return 1; }
    for(int i=0;i<n;i++){ if(sizes[i]>8){ fprintf(stderr,"[fake] %s: parameter %d has %zu bytes (at most 8 are queued)\n",((FKern*)f)->name,i,sizes[i]); free(op); return 1; }
      op->slots[i]=&op->vals[i]; memcpy(&op->vals[i],params[i],sizes[i]); }
    fa_enqueue(c->hStream,op); return 0; }
  return run_kernel(c,f,params);}
static CUresult run_kernel(const CUlaunchConfig* c,void* f,void** params){
  FKern* k=f; cudacpu_dim3 g={c->gx,c->gy,c->gz}, b={c->bx,c->by,c->bz}; char err[1024];
  LOG("cuLaunchKernelEx %s grid=(%u,%u,%u) block=(%u,%u,%u) shm=%u nattrs=%u stream=%p dev=%d",k->name,c->gx,c->gy,c->gz,c->bx,c->by,c->bz,c->shm,c->nattrs,c->hStream,streamdev(c->hStream));
  int rc=cudacpu_launch(k->k,g,b,c->shm,params,cooperative_of(c),fake_sms(),err,sizeof err);
  if(rc) fprintf(stderr,"[fake] launch refused: %s\n",err);
  return rc;}

CUresult cuStreamIsCapturing(void* s,int* st){*st=0;return 0;}
CUresult cuStreamGetCaptureInfo(void* s,int* st,unsigned long long* id,void** g,void** deps,void** ed,size_t* n){if(st)*st=0;return 0;}
CUresult cuPointerGetAttribute(void* data,int attr,uintptr_t p){if(!range_attr(attr,data,p))memset(data,0,8);return 0;}
CUresult cuKernelGetAttribute(int* pi,int attr,void* k,int dev){*pi=attr==0?1024:0;return 0;}
/* each parameter at the next offset its size aligns (as the CUDA ABI lays them out) */
CUresult cuKernelGetParamInfo(void* k,size_t idx,size_t* off,size_t* sz){ size_t sizes[256]; int n=cudacpu_params(((FKern*)k)->k,sizes,256);
  if((int)idx>=n) return 1; size_t at=0; for(size_t i=0;i<=idx;i++){ size_t a=sizes[i]>8?8:sizes[i]; at=(at+a-1)/a*a; if(i<idx) at+=sizes[i]; }
  *off=at; *sz=sizes[idx]; return 0; }
CUresult cuKernelGetParamCount(void* k,size_t* n){*n=(size_t)cudacpu_params(((FKern*)k)->k,0,0);return 0;}
CUresult cuMemGetDefaultMemPool(void** p,void* loc,int t){*p=&g_pools[((int*)loc)[1]];return 0;}
CUresult cuMemPoolSetAccess(void* p,void* d,size_t n){const int* a=(const int*)d; for(size_t i=0;i<n;i++){ LOG("cuMemPoolSetAccess pool of dev %d: dev %d gets flags=%d (loc.type=%d)",POOLIDX(p),a[3*i+1],a[3*i+2],a[3*i]); g_access[POOLIDX(p)][a[3*i+1]]=a[3*i+2]; } return 0;}
CUresult cuLibraryGetModule(void** m,void* l){*m=l;return 0;}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n,void* f,int bs,size_t shm){*n=cudacpu_blocks_per_sm(((FKern*)f)->k,bs,shm);LOG("cuOccupancyMaxActiveBlocksPerMultiprocessor bs=%d -> %d",bs,*n);return 0;}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n,void* f,int bs,size_t shm,unsigned fl){*n=cudacpu_blocks_per_sm(((FKern*)f)->k,bs,shm);return 0;}
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
X(cuMemPoolGetAccess),X(cuMemAllocFromPoolAsync),X(cuMemAllocAsync),X(cuMemFreeAsync),X(cuMemcpyAsync),X(cuLaunchHostFunc),X(cuMemsetD8Async),X(cuMemsetD16Async),
X(cuMemsetD32Async),X(cuMemsetD2D32Async),X(cuMemcpy2DAsync),X(cuPointerGetAttributes),X(cuGetErrorString),X(cuGetErrorName),X(cuLibraryLoadData),X(cuLibraryUnload),
X(cuLibraryGetKernel),X(cuKernelGetFunction),X(cuLaunchKernelEx),X(cuStreamIsCapturing),X(cuStreamGetCaptureInfo),X(cuPointerGetAttribute),X(cuKernelGetAttribute),X(cuKernelGetParamInfo),X(cuKernelGetParamCount),X(cuMemGetDefaultMemPool),X(cuMemPoolSetAccess),X(cuLibraryGetModule),X(cuOccupancyMaxActiveBlocksPerMultiprocessor),X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags),X(cuCtxDisablePeerAccess),X(cuMemPoolCreate),X(cuMemPoolDestroy),X(cuMemPoolTrimTo),X(cuMemPoolExportToShareableHandle),X(cuMemPoolImportFromShareableHandle),X(cuMemPoolExportPointer),X(cuMemPoolImportPointer),{0,0}};
CUresult cuGetProcAddress_v2(const char* sym,void** pfn,int ver,uint64_t flags,int* st){
  for(int i=0;T[i].n;i++) if(!strcmp(T[i].n,sym)){*pfn=T[i].f; if(st)*st=0; return 0;}
  if(getenv("FAKE_MISS")) fprintf(stderr,"[fake] MISSING %s\n",sym);
  *pfn=0; if(st)*st=1; return 500;}
CUresult cuGetProcAddress(const char* sym,void** pfn,int ver,uint64_t flags){return cuGetProcAddress_v2(sym,pfn,ver,flags,0);}
CUresult cuGetExportTable(const void** tbl, const void* uuid){LOG("cuGetExportTable -> not supported"); if(tbl)*tbl=0; return 801;}
