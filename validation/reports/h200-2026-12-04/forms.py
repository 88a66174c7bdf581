"""Offline refit of this run's decode and prefill samples in two cost forms (no numpy).

    python3 forms.py profile-tiny        # or all-r1/profile

Each form is fitted by non-negative least squares on relative error to `samples.jsonl`
and judged on `holdout.jsonl` (median |error|):
- today's `sum` form: u * FLOPs + v * bytes (weights and KV) + b;
- attention apart: u * dense FLOPs + a * attention FLOPs + v * bytes + b.
The constants are qwen2.5-vl-tiny's (models/data/models/qwen2.5-vl-tiny.toml): 6,329,856
LLM parameters, 6 layers x 8 heads x 32 dims, 1,536 KV bytes a token, vocabulary 4096,
hidden 256. An analysis of the committed samples, not part of the build.
"""
import json, itertools, sys
d0=sys.argv[1] if len(sys.argv) > 1 else 'profile-tiny'
def load(f,k): return [json.loads(l) for l in open(f) if f'"{k}"' in l]
F=2*6329856; A=4*6*8*32; K=1536; W=6329856*2; LM=2*256*4096
def solve(M,v):
    n=len(v); M=[r[:]+[v[i]] for i,r in enumerate(M)]
    for i in range(n):
        p=max(range(i,n),key=lambda r:abs(M[r][i])); M[i],M[p]=M[p],M[i]
        if abs(M[i][i])<1e-300: raise ZeroDivisionError
        for r in range(n):
            if r!=i:
                f=M[r][i]/M[i][i]; M[r]=[a-f*b for a,b in zip(M[r],M[i])]
    return [M[i][n]/M[i][i] for i in range(n)]
def nnls(S,H,feat, names):
    best=None
    for k in range(1,len(names)+1):
        for sub in itertools.combinations(range(len(names)),k):
            X=[[feat(d)[i]/d['measured_ns'] for i in sub] for d in S]
            M=[[sum(r[i]*r[j] for r in X) for j in range(k)] for i in range(k)]
            v=[sum(r[i] for r in X) for i in range(k)]
            try: c=solve(M,v)
            except ZeroDivisionError: continue
            if min(c)<0: continue
            full=[0]*len(names)
            for i,ci in zip(sub,c): full[i]=ci
            sse=sum((sum(a*b for a,b in zip(full,feat(d)))/d['measured_ns']-1)**2 for d in S)
            if best is None or sse<best[0]: best=(sse,full)
    full=best[1]
    def med(D):
        e=sorted(abs(sum(a*b for a,b in zip(full,feat(d)))/d['measured_ns']-1)*100 for d in D); return e[len(e)//2]
    return f"fit {med(S):.1f}% hold-out {med(H):.1f}%"
S=load(d0+'/samples.jsonl','decode'); H=load(d0+'/holdout.jsonl','decode')
pairs=lambda d: d['context_tokens']+d['batch']
print("decode  today's sum form:", nnls(S,H,lambda d:[d['batch']*(F+LM)+pairs(d)*A, W+pairs(d)*K, 1.0],'uvb'))
print("decode  attention apart: ", nnls(S,H,lambda d:[d['batch']*(F+LM), pairs(d)*A, W+pairs(d)*K, 1.0],'uavb'))
S=load(d0+'/samples.jsonl','prefill'); H=load(d0+'/holdout.jsonl','prefill')
pp=lambda d: d['new_tokens']*d['cached_tokens']+d['new_tokens']*(d['new_tokens']+1)/2
pf=lambda d: d['new_tokens']*F+LM
pb=lambda d: W+(d['new_tokens']+d['cached_tokens'])*K
print("prefill today's sum form:", nnls(S,H,lambda d:[pf(d)+pp(d)*A, pb(d), 1.0],'uvb'))
print("prefill attention apart: ", nnls(S,H,lambda d:[pf(d), pp(d)*A, pb(d), 1.0],'uavb'))
