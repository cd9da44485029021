# Side by side: the points and indexes of a new run (first file) and old runs (the others), from their text reports.
import re,sys
def parse(path):
    pts={}; idx={}
    sec=None
    for l in open(path):
        if l.startswith('Per-client'): sec='p'; continue
        if l.startswith('LatencyImpactRatio'): sec='i'; continue
        if l.startswith('stderr'): sec=None
        f=l.split()
        if sec=='p' and len(f)==6 and f[0].startswith('drove'):
            pts[(f[0],f[1],int(f[2]))]=(f[3],f[4],f[5])
        if sec=='i' and len(f)==5 and f[0].startswith('drove'):
            idx[(f[0],f[1],int(f[2]))]=(f[3],f[4])
    return pts,idx
old={};oldi={}
for p in sys.argv[2:]:
    a,b=parse(p); old.update(a); oldi.update(b)
new,newi=parse(sys.argv[1])
print(f"{'system':16} {'op':12} {'X':>3} | {'0ms old':>8} {'new':>8} | {'10ms old':>8} {'new':>8} | {'LIR old':>7} {'new':>5} | {'PIR old':>7} {'new':>5}")
for k in sorted(old, key=lambda k:(k[0],['block-write','block-read','small-write','small-read'].index(k[1]),k[2])):
    if k not in new: continue
    o,n=old[k],new[k]; oi,ni=oldi.get(k,('-','-')),newi.get(k,('-','-'))
    flag = '' if (oi==ni) else '  <-'
    print(f"{k[0]:16} {k[1]:12} {k[2]:>3} | {o[0]:>8} {n[0]:>8} | {o[1]:>8} {n[1]:>8} | {oi[0]:>7} {ni[0]:>5} | {oi[1]:>7} {ni[1]:>5}{flag}")
