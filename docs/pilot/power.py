"""The power calculation of docs/PILOT.md ("How many seeds"): for each headline claim, the share of
simulated experiments of n seeds whose 95% t interval decides the claim, with the per-seed contrast
drawn from a normal with the planning effect and the seed-to-seed sd backed out of the 3-seed report
of d6979a0 (half-width = t(0.975, 2) x sd / sqrt(3)). Standard library only:

    python3 docs/pilot/power.py
"""
import random, math, statistics
# t quantiles 0.975
TQ={1:12.706,2:4.303,3:3.182,4:2.776,5:2.571,6:2.447,7:2.365,8:2.306,9:2.262,10:2.228,11:2.201,12:2.179,13:2.160,14:2.145,15:2.131}
def power(effect, sd, n, rule, delta, reps=40000, rng=random.Random(7)):
    ok=0
    for _ in range(reps):
        xs=[rng.gauss(effect, sd) for _ in range(n)]
        m=sum(xs)/n; s=statistics.stdev(xs); h=TQ[n-1]*s/math.sqrt(n)
        if rule=="effect": ok += (m-h>0 and m>=delta)
        else: ok += (m+h<delta)
    return ok/reps
claims=[("softmax-degrades plain",0.195,0.0795,"effect",0.02),("softmax-degrades ntk",0.150,0.059,"effect",0.02),
("interaction plain",0.176,0.086,"effect",0.02),("interaction ntk",0.118,0.055,"effect",0.02),
("lssar-vs-half-softmax plain",-0.078,0.043,"atmost",0.0),("lssar-vs-half-softmax ntk",-0.043,0.035,"atmost",0.0),
("lssar-flat<0.02 plain (old)",0.019,0.0165,"atmost",0.02),
("large-p-train",0.080,0.083,"effect",0.05),("large-p-posthoc",-0.016,0.0515,"effect",0.05)]
print("claim | "+" | ".join(f"n={n}" for n in range(3,13)))
for name,e,sd,rule,d in claims:
    print(name, " | ".join(f"{power(e,sd,n,rule,d):.2f}" for n in range(3,13)))
print("at 2/3 of the planning effects")
for name,e,sd,rule,d in claims[:6]:
    e2 = e*2/3 if rule=="effect" else e*2/3
    print(name, " | ".join(f"{power(e2,sd,n,rule,d):.2f}" for n in range(3,13)))
