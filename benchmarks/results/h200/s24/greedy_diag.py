"""s24: why GraphDecoder.greedy's ANDed flag pages say NaN on the GPU (the sim passes): the pages and the ANDed copies
byte by byte after the capture and after single pipelined launches, tiny llama Q8_0."""
import os
import numpy as np
from refengine.model import Model
from refengine.runtime import Runtime
from refengine.synth import write_synth
from refengine.cuda.graph_step import GraphDecoder

write_synth("llama", "/tmp/llama.gguf", wtype="Q8_0")
m = Model("/tmp/llama.gguf")
P = [1, 5, 9, 3]
KW = dict(resident=True) if os.environ.get("SIM") else dict(backend="cuda")
rt, st = Runtime(fixed_shapes=True, **KW), m.new_state()
first = int(np.argmax(m.forward(P, st, rt=rt, last_only=True)[-1]))
dec = GraphDecoder(m, rt, st)
dec.reserve(64)
ids = [first]
with dec._context():
    for _ in range(2):
        lg, _ = dec._one([ids[-1]], dec.GREEDY, feed=True)
        ids.append(int(np.argmax(lg[-1])))
g = dec.graphs[dec.GREEDY]
labels, texts, pages, lazy, rows = g.flags
ring, count, accs = g.feed
dev = dec.dev
u8 = lambda a: dev.get(a).view(np.uint8).reshape(-1)
n = len(rows)
print("labels", len(labels), "texts", len(texts), "rows", rows[:12], "pages", [p.shape for p in pages],
      "accs", [a.shape for a in accs], "acc is pg", [a.raw is p.raw for a, p in zip(accs, pages)])
print("after capture: pages", u8(pages[0])[:24], "accs", u8(accs[0])[:24])
with dec._context():
    for trial in range(3):
        dec._write(g.step.tokens, np.array([ids[-1]]))
        dec._write(g.step.pos, np.array([st.n_past]))
        dec._write(count, np.zeros(1))
        for a in accs:
            dec._write(a, np.ones(a.shape, dtype=bool))
        dec.cps and dec.cps.synchronize()
        print(f"trial {trial}: accs after the ones write", u8(accs[0])[:24])
        g.graph.launch(dec.stream)
        dec.cps and dec.cps.synchronize()
        dec._advance(g, 1)
        print(f"trial {trial}: after one launch: pages", u8(pages[0])[:24], " accs", u8(accs[0])[:24],
              " ring", dev.get(ring)[:3], "count", dev.get(count))
        bad = [labels[i] for i in range(len(labels)) if not dev.get(pages[0]).reshape(-1, 2)[rows[i], 0]]
        bada = [labels[i] for i in range(len(labels)) if not dev.get(accs[0]).reshape(-1, 2)[rows[i], 0]]
        print("   pages say NaN:", bad[:4], " accs say NaN:", bada[:4])
        ids.append(int(dev.get(ring)[0]))
