"""Paired, interleaved comparison of two tend binaries on the sandbox
provider: 10,000 declarations in a real repository, a cold apply each,
then no-change applies, one-change applies and no-change plans, each run
alternating between the binaries so both see the same machine.

    python3 scripts/compare_apply.py OLD_TEND NEW_TEND [RUNS] [WORKDIR]

Prints medians and peak RSS (GNU time at /usr/bin/time). See
docs/performance.md.
"""
import os, subprocess, time, statistics, sys, shutil
N=10000
root=sys.argv[4] if len(sys.argv)>4 else '/tmp/tend-compare'
bins={'old':os.path.abspath(sys.argv[1]),'new':os.path.abspath(sys.argv[2])}
env=dict(os.environ, GIT_CONFIG_NOSYSTEM='1', GIT_CONFIG_GLOBAL='/dev/null', GIT_AUTHOR_NAME='a', GIT_AUTHOR_EMAIL='a@x', GIT_COMMITTER_NAME='a', GIT_COMMITTER_EMAIL='a@x')
env.pop('TEND_LOG',None)
def git(*a): subprocess.run(['git',*a],cwd=root+'/repo',env=env,check=True,stdout=subprocess.DEVNULL)
def manifest(name,limit): return f"apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  connectionLimit: {limit}\n"
if not os.path.exists(root+'/repo/.git'):
    shutil.rmtree(root,ignore_errors=True)
    os.makedirs(root+'/repo')
    git('init','-q','-b','main')
    for i in range(N):
        d=f"{root}/repo/databases/team-{i%100:02d}"; os.makedirs(d,exist_ok=True)
        open(f"{d}/db-{i:05d}.yaml",'w').write(manifest(f"db-{i:05d}",i%500))
    git('add','-A'); git('commit','-q','-m','decls')
for k in bins:
    d=f"{root}/{k}"; shutil.rmtree(d,ignore_errors=True); os.makedirs(d)
    open(d+'/tend.toml','w').write(f'agent_id = "bench"\nstate_dir = "state"\n[source]\nurl = "file://{root}/repo"\npath = "databases"\n[reconcile]\nmax_concurrency = 16\n[providers.sandbox]\nkind = "sandbox"\nrate_limit = 10000\nmax_concurrency = 16\n')
def run(k,cmd='apply'):
    t=time.time()
    p=subprocess.run(['/usr/bin/time','-f','rss-kib %M',bins[k],'--config','tend.toml',cmd],cwd=f"{root}/{k}",capture_output=True,text=True)
    w=(time.time()-t)*1000
    rss=int([l for l in p.stderr.splitlines() if l.startswith('rss-kib')][-1].split()[1])
    return w,rss,p.returncode,p.stderr
res={}
for k in bins:
    w,rss,code,err=run(k)
    print(f"cold {k}: {w/1000:.2f}s rss {rss/1024:.0f}MB code {code} {[l for l in err.splitlines() if 'operations' in l]}",flush=True)
R=int(sys.argv[3]) if len(sys.argv)>3 else 15
nc={k:[] for k in bins}; ncr={k:[] for k in bins}
for i in range(R):
    for k in bins:
        w,rss,code,err=run(k); assert code==0,(k,err[-500:]); assert '\n0 operations' in '\n'+err or err.startswith('0 operations'),err[-300:]
        nc[k].append(w); ncr[k].append(rss)
for k in bins:
    s=sorted(nc[k]); print(f"no-change {k}: median {statistics.median(s):.0f} ms min {s[0]:.0f} max {s[-1]:.0f}; peak rss {max(ncr[k])/1024:.0f} MB",flush=True)
oc={k:[] for k in bins}; ocr={k:[] for k in bins}
for i in range(5):
    open(f"{root}/repo/databases/team-07/db-00007.yaml",'w').write(manifest('db-00007',100+i+int(time.time())%1000))
    git('commit','-qam','raise')
    for k in bins:
        w,rss,code,err=run(k); assert code==0,err[-500:]; assert '1 operations, 1 done' in err, err[-300:]
        oc[k].append(w); ocr[k].append(rss)
for k in bins:
    s=sorted(oc[k]); print(f"one-change {k}: median {statistics.median(s):.0f} ms min {s[0]:.0f} max {s[-1]:.0f}; peak rss {max(ocr[k])/1024:.0f} MB",flush=True)
pl={k:[] for k in bins}; plr={k:[] for k in bins}
for i in range(5):
    for k in bins:
        w,rss,code,err=run(k,'plan'); pl[k].append(w); plr[k].append(rss)
for k in bins:
    s=sorted(pl[k]); print(f"plan {k}: median {statistics.median(s):.0f} ms min {s[0]:.0f} max {s[-1]:.0f}; peak rss {max(plr[k])/1024:.0f} MB",flush=True)
