// The page of `sdpa serve`. Every number shown comes from the server's JSON API, which computes
// it with the sdpa library; this script only sends the controls' values and draws the answers
// with Chart.js. window.sdpa exposes the charts and the last request/response of each panel
// (the browser test reads them).
'use strict';

const LANG = document.documentElement.dataset.lang === 'zh' ? 'zh' : 'en';

const TEXT = {
  en: {
    title: 'Why attention divides by √d',
    intro: 'Turn the knobs: every number below is computed by the sdpa library on the server for ' +
      'the values you choose. The argument: q·k of d independent unit-variance components has ' +
      'variance d, so without a scale the scores grow like √d, the softmax freezes onto one key ' +
      'and the gradient through it vanishes; 1/√d keeps the variance at 1.',
    scores_title: '1. Scores',
    scores_lead: 'N keys and a few query rows, each component drawn from the chosen law (with a ' +
      'mean and a correlation across dimensions). Left: the histogram of the scaled scores against ' +
      'the theory. Middle: one row\'s softmax. Right: how much gradient reaches each row.',
    d_label: 'd (dimensions)', n_label: 'N (keys)', dist_label: 'distribution of q and k',
    dist_normal: 'normal', dist_uniform: 'uniform', dist_rademacher: 'Rademacher (±1)',
    dist_t: 'Student-t (ν = 5)', dist_laplace: 'Laplace',
    mean_label: 'mean μ', sigma_label: 'standard deviation σ', corr_label: 'correlation ρ',
    scale_label: 'scale', scale_number: 'a number…', scale_value: 'scale value', cap_label: 'cap c',
    seed_label: 'seed',
    hist_measured: 'measured', hist_theory: 'theory',
    hist_caption: (r) => `variance of the scaled scores: measured ${f(r.variance.measured)}, ` +
      `closed form ${f(r.variance.theory)}${r.variance.exact ? '' : ' (approximate)'}\n` +
      `unscaled q·k: variance ${f(r.raw_variance.measured)} vs σ⁴d(1+(d−1)ρ²)+2μ²σ²d(1+(d−1)ρ) = ` +
      `${f(r.raw_variance.theory)}; ${r.rows} rows × ${r.n} keys` +
      (r.hist.outside > 0 ? `; ${pct(r.hist.outside)} outside the plotted range` : ''),
    row_probs: 'probability (largest first)', row_uniform: 'uniform 1/N',
    row_caption: (r) => `row 1: entropy ${f(r.row.entropy)} nats of ln N = ${f(r.row.ln_n)}; ` +
      `max probability ${f(r.row.max_prob)}; Jacobian norm ‖diag(p) − ppᵀ‖ ${f(r.row.jacobian_norm)}\n` +
      `all ${r.rows} rows: mean entropy ${f(r.rows_summary.entropy_mean)}, theory ` +
      (r.rows_summary.entropy_theory === null ? 'frozen (s² ≥ 2 ln N)' :
        `ln N − s²/2 = ${f(r.rows_summary.entropy_theory)}`) +
      ` with s² = ${f(r.rows_summary.row_variance_theory)}`,
    grad_rows: 'rows', grad_axis: 'log₁₀ ‖gradient reaching the logits‖',
    grad_caption: (r) => `median ${f(r.grad.median)}; dead (below ${f(r.grad.dead_threshold)}, ` +
      `a thousandth of the 1/√d median): ${pct(r.grad.dead_fraction)} of ${r.rows} rows` +
      (r.grad.zeros ? `; ${r.grad.zeros} exactly zero (not plotted)` : ''),
    computed: (ms) => `computed on the server in ${ms.toFixed(1)} ms`,
    softmax_title: '2. Softmax playground',
    softmax_lead: 'Type logits and a temperature T. Stable: exp(x/T − max) / Σ; naive: exp(x/T) / Σ ' +
      'as written in the article. Each is computed with every operation rounded to the format. ' +
      'The gradient is that of p[target] with respect to each logit.',
    logits_label: 'logits (comma separated)', temp_label: 'temperature T', target_label: 'target index',
    th_format: 'format', th_method: 'method', th_probs: 'probabilities', th_sum: 'sum',
    th_error: 'max error vs float64 library', th_grad: 'gradient d p[target] / d x',
    stable: 'stable', naive: 'naive',
    softmax_p: 'p (library, float64)', softmax_g: 'd p[target] / d x',
    softmax_caption: (r) => `library: entropy ${f(r.library.entropy)} nats, Jacobian norm ` +
      `${f(r.library.jacobian_norm)}`,
    train_title: '3. Training',
    train_lead: 'One attention layer learns associative recall (the lab\'s C8 task: 16 key→value ' +
      'pairs, recall the value of a query key). Start a run, watch it stream, start another with a ' +
      'different scale: the runs are overlaid.',
    opt_label: 'optimizer', lr_label: 'learning rate', steps_label: 'steps', eval_label: 'evaluate every',
    start: 'Start', stop: 'Stop', clear: 'Clear',
    loss: 'held-out loss (nats)', accuracy: 'held-out accuracy', entropy: 'attention entropy (nats)',
    max_logit: 'largest |scale·q·k|', step: 'step',
    train_running: (id) => `run ${id} running…`,
    train_ended: (id, state, n, s) => `run ${id}: ${state} after ${n} points (${s.toFixed(1)} s)`,
    freeze_title: '4. Freezing map',
    freeze_lead: 'Mean attention entropy as a fraction of ln N over d and N, for one scale. The ' +
      'line is the random energy model\'s boundary s² = 2 ln N (s² the closed-form variance of a ' +
      'row\'s scores): beyond it the softmax freezes onto a few keys.',
    dmax_label: 'largest d', nmax_label: 'largest N',
    freeze_inputs: 'q and k follow the distribution, mean, σ, ρ and seed chosen in panel 1.',
    freeze_cells: 'H / ln N', freeze_boundary: 'theory: s² = 2 ln N',
    freeze_caption: (r) => r.boundary.length ? `${r.grid.length} cells, ${r.rows} rows each; ` +
      `boundary drawn where the closed form crosses 2 ln N` :
      `${r.grid.length} cells, ${r.rows} rows each; the closed form never reaches 2 ln N here: ` +
      `no freezing predicted`,
    footer: 'sdpa serve: a local page; it loads nothing from the network.',
    busy: 'busy: ',
  },
  zh: {
    title: '注意力为什么要除以 √d',
    intro: '拖动滑块：下面每个数字都由服务器上的 sdpa 库按你选的参数现算。论证是：d 个独立、方差为 1 的' +
      '分量的 q·k 方差为 d，不缩放时分数按 √d 增长，softmax 冻结在一个键上，梯度随之消失；' +
      '乘以 1/√d 使方差保持为 1。',
    scores_title: '1. 分数',
    scores_lead: 'N 个键和若干查询行，每个分量从所选分布抽取（可设均值和维度间相关）。左：缩放后分数的' +
      '直方图与理论曲线。中：一行的 softmax。右：每行收到的梯度大小。',
    d_label: 'd（维数）', n_label: 'N（键数）', dist_label: 'q 和 k 的分布',
    dist_normal: '正态', dist_uniform: '均匀', dist_rademacher: 'Rademacher（±1）',
    dist_t: 'Student-t（ν = 5）', dist_laplace: 'Laplace',
    mean_label: '均值 μ', sigma_label: '标准差 σ', corr_label: '相关系数 ρ',
    scale_label: '缩放', scale_number: '自定义数值…', scale_value: '缩放值', cap_label: '上限 c',
    seed_label: '随机种子',
    hist_measured: '实测', hist_theory: '理论',
    hist_caption: (r) => `缩放后分数的方差：实测 ${f(r.variance.measured)}，闭式解 ` +
      `${f(r.variance.theory)}${r.variance.exact ? '' : '（近似）'}\n` +
      `未缩放 q·k：方差 ${f(r.raw_variance.measured)}，公式 σ⁴d(1+(d−1)ρ²)+2μ²σ²d(1+(d−1)ρ) = ` +
      `${f(r.raw_variance.theory)}；${r.rows} 行 × ${r.n} 个键` +
      (r.hist.outside > 0 ? `；${pct(r.hist.outside)} 在绘图范围外` : ''),
    row_probs: '概率（从大到小）', row_uniform: '均匀 1/N',
    row_caption: (r) => `第 1 行：熵 ${f(r.row.entropy)} nats，ln N = ${f(r.row.ln_n)}；` +
      `最大概率 ${f(r.row.max_prob)}；雅可比范数 ‖diag(p) − ppᵀ‖ ${f(r.row.jacobian_norm)}\n` +
      `全部 ${r.rows} 行：平均熵 ${f(r.rows_summary.entropy_mean)}，理论 ` +
      (r.rows_summary.entropy_theory === null ? '冻结（s² ≥ 2 ln N）' :
        `ln N − s²/2 = ${f(r.rows_summary.entropy_theory)}`) +
      `，s² = ${f(r.rows_summary.row_variance_theory)}`,
    grad_rows: '行数', grad_axis: 'log₁₀ ‖到达 logits 的梯度‖',
    grad_caption: (r) => `中位数 ${f(r.grad.median)}；死亡（低于 ${f(r.grad.dead_threshold)}，` +
      `即 1/√d 中位数的千分之一）：${r.rows} 行中的 ${pct(r.grad.dead_fraction)}` +
      (r.grad.zeros ? `；${r.grad.zeros} 行恰为零（未绘出）` : ''),
    computed: (ms) => `服务器计算用时 ${ms.toFixed(1)} 毫秒`,
    softmax_title: '2. Softmax 实验台',
    softmax_lead: '输入 logits 和温度 T。稳定版：exp(x/T − max) / Σ；朴素版：文章中的 exp(x/T) / Σ。' +
      '每一步运算都舍入到对应格式。梯度为 p[target] 对每个 logit 的导数。',
    logits_label: 'logits（逗号分隔）', temp_label: '温度 T', target_label: '目标下标',
    th_format: '格式', th_method: '方法', th_probs: '概率', th_sum: '和',
    th_error: '相对 float64 库结果的最大误差', th_grad: '梯度 d p[target] / d x',
    stable: '稳定', naive: '朴素',
    softmax_p: 'p（库，float64）', softmax_g: 'd p[target] / d x',
    softmax_caption: (r) => `库：熵 ${f(r.library.entropy)} nats，雅可比范数 ${f(r.library.jacobian_norm)}`,
    train_title: '3. 训练',
    train_lead: '一层注意力学习联想回忆（实验室的 C8 任务：16 对键→值，回答查询键对应的值）。' +
      '启动一次训练，看曲线实时出现；换一种缩放再启动，曲线叠加对比。',
    opt_label: '优化器', lr_label: '学习率', steps_label: '步数', eval_label: '评估间隔',
    start: '开始', stop: '停止', clear: '清除',
    loss: '验证损失（nats）', accuracy: '验证准确率', entropy: '注意力熵（nats）',
    max_logit: '最大 |scale·q·k|', step: '步',
    train_running: (id) => `第 ${id} 次训练进行中…`,
    train_ended: (id, state, n, s) => `第 ${id} 次训练：${state}，共 ${n} 个点（${s.toFixed(1)} 秒）`,
    freeze_title: '4. 冻结图',
    freeze_lead: '在 d 和 N 上，平均注意力熵占 ln N 的比例（给定缩放）。曲线是随机能量模型的边界 ' +
      's² = 2 ln N（s² 为一行分数方差的闭式解）：越过它，softmax 冻结在少数几个键上。',
    dmax_label: '最大 d', nmax_label: '最大 N',
    freeze_inputs: 'q 和 k 使用第 1 部分所选的分布、均值、σ、ρ 和种子。',
    freeze_cells: 'H / ln N', freeze_boundary: '理论：s² = 2 ln N',
    freeze_caption: (r) => r.boundary.length ? `${r.grid.length} 个格子，每格 ${r.rows} 行；` +
      `边界画在闭式解越过 2 ln N 处` :
      `${r.grid.length} 个格子，每格 ${r.rows} 行；闭式解在此范围内达不到 2 ln N：不预测冻结`,
    footer: 'sdpa serve：本地页面，不从网络加载任何内容。',
    busy: '忙：',
  },
};
const T = TEXT[LANG];

// ---- helpers ----------------------------------------------------------------------------------
function f(x) {
  if (typeof x === 'string') return x;
  if (x === null || x === undefined) return '–';
  if (x === 0) return '0';
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(3);
  return Number(x.toPrecision(4)).toString();
}
function pct(x) { return `${(100 * x).toFixed(1)}%`; }
const $ = (id) => document.getElementById(id);
const CLIENT = (crypto.randomUUID ? crypto.randomUUID() :
  String(Math.random()).slice(2) + String(Date.now())).replace(/[^A-Za-z0-9-]/g, '');

async function api(path, body) {
  const init = { headers: { 'X-Sdpa-Client': CLIENT } };
  if (body !== undefined) {
    init.method = 'POST';
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const data = await res.json();
  if (!res.ok) {
    const err = new Error(data.error || res.statusText);
    err.status = res.status;
    err.data = data;
    throw err;
  }
  return data;
}

// Sends at most one request per panel at a time; a change made meanwhile is sent when the
// answer comes, with the controls' latest values (older values are never drawn).
function latest(build, send, render, statusEl) {
  let busy = false, dirty = false;
  async function go() {
    if (busy) { dirty = true; return; }
    busy = true;
    dirty = false;
    window.sdpa.inflight++;
    const request = build();
    try {
      const response = await send(request);
      render(request, response);
      statusEl.classList.remove('error');
    } catch (e) {
      statusEl.textContent = e.message;
      statusEl.classList.add('error');
    } finally {
      busy = false;
      window.sdpa.inflight--;
      if (dirty) go();
    }
  }
  return go;
}

Chart.defaults.animation = false;
Chart.defaults.font.size = 11;
Chart.defaults.maintainAspectRatio = false;
const COLORS = ['#2f6fdf', '#d9480f', '#2b8a3e', '#862e9c', '#c2255c', '#0b7285', '#e67700', '#495057'];

window.sdpa = { charts: {}, last: {}, renders: { scores: 0, softmax: 0, freeze: 0 }, inflight: 0,
  runs: [], client: CLIENT };

document.querySelectorAll('[data-t]').forEach((el) => {
  const v = T[el.dataset.t];
  if (typeof v === 'string') el.textContent = v;
});
document.title = T.title + ' · sdpa serve';

// ---- panel 1: scores --------------------------------------------------------------------------
const D_LIST = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
  1536, 2048, 3072, 4096];
const N_LIST = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
$('d-slider').max = D_LIST.length - 1;
$('d-slider').value = D_LIST.indexOf(64);
$('n-slider').max = N_LIST.length - 1;
$('n-slider').value = N_LIST.indexOf(1024);

function scaleValue(selectId) {
  const v = $(selectId).value;
  return v === 'number' ? Number($('scale-number').value) : v;
}
function inputsRequest() {
  return {
    dist: $('dist').value,
    mean: Number($('mean').value),
    sigma: Number($('sigma').value),
    corr: Number($('corr').value),
    seed: Number($('seed').value),
  };
}
function scoresRequest() {
  const r = Object.assign({ d: D_LIST[Number($('d-slider').value)],
    n: N_LIST[Number($('n-slider').value)] }, inputsRequest(), { scale: scaleValue('scale') });
  if (r.scale === 'softcap') r.cap = Number($('cap').value);
  return r;
}
function showScoreControls() {
  $('d-value').textContent = D_LIST[Number($('d-slider').value)];
  $('n-value').textContent = N_LIST[Number($('n-slider').value)];
  $('mean-value').textContent = Number($('mean').value).toFixed(2);
  $('sigma-value').textContent = Number($('sigma').value).toFixed(2);
  $('corr-value').textContent = Number($('corr').value).toFixed(2);
  $('scale-number-box').classList.toggle('hidden', $('scale').value !== 'number');
  $('cap-box').classList.toggle('hidden', $('scale').value !== 'softcap');
}

const charts = window.sdpa.charts;
charts.hist = new Chart($('hist-chart'), {
  type: 'line',
  data: { datasets: [
    { label: T.hist_measured, data: [], stepped: 'middle', fill: true, borderWidth: 1,
      borderColor: COLORS[0], backgroundColor: 'rgba(47,111,223,0.25)', pointRadius: 0 },
    { label: T.hist_theory, data: [], borderColor: COLORS[1], borderWidth: 2, pointRadius: 0 },
  ] },
  options: { parsing: false, scales: { x: { type: 'linear', title: { display: true, text: 'scale · q·k' } },
    y: { beginAtZero: true, title: { display: true, text: 'density' } } } },
});
charts.row = new Chart($('row-chart'), {
  type: 'bar',
  data: { labels: [], datasets: [
    { label: T.row_probs, data: [], backgroundColor: COLORS[0] },
    { label: T.row_uniform, data: [], type: 'line', borderColor: COLORS[1], borderWidth: 1.5,
      pointRadius: 0 },
  ] },
  options: { scales: { y: { type: 'logarithmic', title: { display: true, text: 'p' } },
    x: { title: { display: true, text: 'rank' } } } },
});
charts.grad = new Chart($('grad-chart'), {
  type: 'bar',
  data: { labels: [], datasets: [{ label: T.grad_rows, data: [], backgroundColor: COLORS[2] }] },
  options: { scales: { x: { title: { display: true, text: T.grad_axis } },
    y: { beginAtZero: true, title: { display: true, text: T.grad_rows } } } },
});

function renderScores(request, r) {
  window.sdpa.last.scores = { request, response: r };
  charts.hist.data.datasets[0].data = r.hist.centers.map((x, i) => ({ x, y: r.hist.density[i] }));
  charts.hist.data.datasets[1].data = r.theory_curve.x.map((x, i) => ({ x, y: r.theory_curve.density[i] }));
  charts.hist.options.scales.x.min = r.hist.centers[0] - r.hist.width / 2;
  charts.hist.options.scales.x.max = r.hist.centers[r.hist.centers.length - 1] + r.hist.width / 2;
  charts.hist.update();
  const probs = r.row.probs_sorted;
  charts.row.data.labels = probs.map((_, i) => i + 1);
  charts.row.data.datasets[0].data = probs.map((p) => Math.max(p, 1e-300));
  charts.row.data.datasets[1].data = probs.map(() => 1 / r.n);
  charts.row.update();
  const g = r.grad.log10_hist;
  charts.grad.data.labels = g.centers.map((c) => c.toFixed(2));
  charts.grad.data.datasets[0].data = g.counts;
  charts.grad.update();
  $('hist-caption').textContent = T.hist_caption(r);
  $('row-caption').textContent = T.row_caption(r);
  $('grad-caption').textContent = T.grad_caption(r);
  $('scores-status').textContent = T.computed(r.ms);
  window.sdpa.renders.scores++;
}
const updateScores = latest(scoresRequest, (req) => api('/api/scores', req), renderScores,
  $('scores-status'));
for (const id of ['d-slider', 'n-slider', 'dist', 'mean', 'sigma', 'corr', 'scale', 'scale-number',
  'cap', 'seed']) {
  $(id).addEventListener('input', () => {
    showScoreControls();
    updateScores();
    if (['dist', 'mean', 'sigma', 'corr', 'seed'].includes(id)) updateFreeze();
  });
}

// ---- panel 2: softmax playground --------------------------------------------------------------
function tempValue() { return Number(Math.pow(10, Number($('temp').value)).toPrecision(4)); }
function softmaxRequest() {
  return { logits: $('logits').value, temperature: tempValue(), target: Number($('target').value) };
}
charts.softmax = new Chart($('softmax-chart'), {
  type: 'bar',
  data: { labels: [], datasets: [
    { label: T.softmax_p, data: [], backgroundColor: COLORS[0] },
    { label: T.softmax_g, data: [], backgroundColor: COLORS[1] },
  ] },
  options: { scales: { x: { title: { display: true, text: 'logit' } } } },
});
function cell(text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function renderSoftmax(request, r) {
  window.sdpa.last.softmax = { request, response: r };
  const table = $('softmax-table');
  table.replaceChildren();
  const head = document.createElement('tr');
  for (const h of [T.th_format, T.th_method, T.th_probs, T.th_sum, T.th_error, T.th_grad]) {
    const th = document.createElement('th');
    th.textContent = h;
    head.appendChild(th);
  }
  table.appendChild(head);
  for (const fmt of r.formats) {
    for (const method of ['stable', 'naive']) {
      const m = fmt[method];
      const tr = document.createElement('tr');
      tr.appendChild(cell(method === 'stable' ? fmt.format : ''));
      tr.appendChild(cell(T[method]));
      tr.appendChild(cell(m.probs.map(f).join(', '), m.ok ? '' : 'bad'));
      tr.appendChild(cell(f(m.sum), m.ok ? '' : 'bad'));
      tr.appendChild(cell(f(m.max_error), m.ok ? '' : 'bad'));
      tr.appendChild(cell(m.grad.map(f).join(', '), m.ok ? '' : 'bad'));
      table.appendChild(tr);
    }
  }
  charts.softmax.data.labels = r.logits.map((x, i) => `${i}: ${f(x)}`);
  charts.softmax.data.datasets[0].data = r.library.float64.map(Number);
  charts.softmax.data.datasets[1].data = r.library.grad.map(Number);
  charts.softmax.update();
  $('softmax-caption').textContent = T.softmax_caption(r);
  $('softmax-status').textContent = '';
  window.sdpa.renders.softmax++;
}
const updateSoftmax = latest(softmaxRequest, (req) => api('/api/softmax', req), renderSoftmax,
  $('softmax-status'));
for (const id of ['logits', 'temp', 'target']) {
  $(id).addEventListener('input', () => {
    $('temp-value').textContent = f(tempValue());
    updateSoftmax();
  });
}

// ---- panel 3: training ------------------------------------------------------------------------
function trainChart(id, key, title, yopts) {
  return new Chart($(id), {
    type: 'line',
    data: { datasets: [] },
    options: { parsing: false, plugins: { title: { display: true, text: title },
      legend: { labels: { boxWidth: 10 } } },
    scales: { x: { type: 'linear', title: { display: true, text: T.step } }, y: yopts || {} } },
  });
}
charts.train = {
  loss: trainChart('train-loss', 'loss', T.loss),
  accuracy: trainChart('train-acc', 'accuracy', T.accuracy, { min: 0, max: 1 }),
  entropy: trainChart('train-entropy', 'entropy', T.entropy, { beginAtZero: true }),
  max_logit: trainChart('train-maxlogit', 'max_logit', T.max_logit, { beginAtZero: true }),
};
let currentRun = null;
function trainRequest() {
  return { scale: $('train-scale').value, d: Number($('train-d').value),
    optimizer: $('train-opt').value, lr: Number($('train-lr').value),
    steps: Number($('train-steps').value), eval_every: Number($('train-eval').value),
    seed: Number($('train-seed').value) };
}
function addPoint(run, p) {
  run.points.push(p);
  for (const key of Object.keys(charts.train)) {
    const y = typeof p[key] === 'number' ? p[key] : NaN;
    run.datasets[key].data.push({ x: p.step, y });
  }
}
function redrawTrain() { for (const c of Object.values(charts.train)) c.update('none'); }
async function startTraining() {
  const request = trainRequest();
  let started;
  try {
    started = await api('/api/train/start', request);
  } catch (e) {
    $('train-status').textContent = (e.data && e.data.busy ? T.busy : '') + e.message;
    $('train-status').classList.add('error');
    return;
  }
  $('train-status').classList.remove('error');
  const color = COLORS[window.sdpa.runs.length % COLORS.length];
  const label = `#${started.id} ${request.scale}, d=${request.d}, ${request.optimizer} ${request.lr}`;
  const run = { id: started.id, request, points: [], state: 'running', datasets: {} };
  for (const [key, chart] of Object.entries(charts.train)) {
    const ds = { label, data: [], borderColor: color, backgroundColor: color, borderWidth: 1.5,
      pointRadius: 0 };
    run.datasets[key] = ds;
    chart.data.datasets.push(ds);
  }
  window.sdpa.runs.push(run);
  currentRun = run;
  $('train-stop').disabled = false;
  $('train-status').textContent = T.train_running(run.id);
  const source = new EventSource(`/api/train/events?id=${run.id}`);
  let pending = false;
  source.addEventListener('point', (ev) => {
    addPoint(run, JSON.parse(ev.data));
    if (!pending) {
      pending = true;
      requestAnimationFrame(() => { pending = false; redrawTrain(); });
    }
  });
  source.addEventListener('end', async (ev) => {
    source.close();
    const end = JSON.parse(ev.data);
    const snap = await api(`/api/train/run?id=${run.id}`);
    run.state = end.state;
    run.seconds = snap.seconds;
    redrawTrain();
    $('train-status').textContent = T.train_ended(run.id, end.state, run.points.length, snap.seconds);
    if (currentRun === run) { currentRun = null; $('train-stop').disabled = true; }
  });
  source.onerror = () => {
    if (run.state === 'running' && source.readyState === EventSource.CLOSED) {
      run.state = 'lost';
      $('train-status').textContent = `run ${run.id}: the event stream closed`;
    }
  };
}
$('train-start').addEventListener('click', startTraining);
$('train-stop').addEventListener('click', async () => {
  if (currentRun) {
    try { await api('/api/train/stop', { id: currentRun.id }); } catch (e) {
      $('train-status').textContent = e.message;
    }
  }
});
$('train-clear').addEventListener('click', () => {
  window.sdpa.runs = window.sdpa.runs.filter((r) => r.state === 'running');
  for (const [key, chart] of Object.entries(charts.train)) {
    chart.data.datasets = window.sdpa.runs.map((r) => r.datasets[key]);
    chart.update('none');
  }
});

// ---- panel 4: freezing map --------------------------------------------------------------------
// A perceptual blue-to-yellow ramp (viridis at five stops), interpolated linearly.
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function rampColor(t) {
  t = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(t)), u = t - i;
  const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * u));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
let freezeCols = 12, freezeRows = 11;
const freezeTicks = { ns: [], ds: [] };  // the grid's N and d: one tick per column and row
// Each cell is drawn as an image point of exactly one cell's size (Chart.js has no heatmap
// type): the axes span half an octave beyond the first and last d and N, so the cells tile.
const cellImages = new Map();
function cellImage(ctx) {
  const a = ctx.chart.chartArea;
  const w = a ? Math.max(1, Math.ceil(a.width / freezeCols)) : 8;
  const h = a ? Math.max(1, Math.ceil(a.height / freezeRows)) : 8;
  const color = rampColor(ctx.raw ? ctx.raw.v : 0);
  const key = `${w}x${h}:${color}`;
  if (!cellImages.has(key)) {
    if (cellImages.size > 4096) cellImages.clear();
    const c = document.createElement('canvas');
    c.width = w;
    c.height = h;
    const g = c.getContext('2d');
    g.fillStyle = color;
    g.fillRect(0, 0, w, h);
    cellImages.set(key, c);
  }
  return cellImages.get(key);
}
charts.freeze = new Chart($('freeze-chart'), {
  type: 'scatter',
  data: { datasets: [
    // Chart.js draws lower `order` last: the boundary goes on top of the cells.
    { label: T.freeze_cells, data: [], pointStyle: cellImage, backgroundColor: rampColor(0.6),
      borderWidth: 0, order: 1 },
    { label: T.freeze_boundary, data: [], type: 'line', borderColor: '#e03131', borderWidth: 2.5,
      pointRadius: 0, showLine: true, order: 0 },
  ] },
  options: {
    parsing: false,
    scales: {
      x: { type: 'logarithmic', title: { display: true, text: 'N' },
        afterBuildTicks: (axis) => { axis.ticks = freezeTicks.ns.map((value) => ({ value })); },
        ticks: { autoSkip: false, callback: (v) => v } },
      y: { type: 'logarithmic', title: { display: true, text: 'd' },
        afterBuildTicks: (axis) => { axis.ticks = freezeTicks.ds.map((value) => ({ value })); },
        ticks: { autoSkip: false, callback: (v) => v } },
    },
    plugins: { tooltip: { callbacks: { label: (ctx) => ctx.raw.v === undefined ?
      `d = ${f(ctx.raw.y)}` : `d=${ctx.raw.y}, N=${ctx.raw.x}: H/ln N = ${f(ctx.raw.v)}` } } },
  },
});
function freezeRequest() {
  return Object.assign(inputsRequest(), { scale: $('freeze-scale').value,
    d_max: Number($('freeze-dmax').value), n_max: Number($('freeze-nmax').value) });
}
function renderFreeze(request, r) {
  window.sdpa.last.freeze = { request, response: r };
  freezeCols = r.ns.length;
  freezeRows = r.ds.length;
  freezeTicks.ns = r.ns;
  freezeTicks.ds = r.ds;
  const ch = charts.freeze;
  ch.data.datasets[0].data = r.grid.map((c) => ({ x: c.n, y: c.d, v: c.normalized }));
  ch.data.datasets[1].data = r.boundary.map((b) => ({ x: b.n, y: b.d }));
  ch.options.scales.x.min = r.ns[0] / Math.SQRT2;
  ch.options.scales.x.max = r.ns[r.ns.length - 1] * Math.SQRT2;
  ch.options.scales.y.min = r.ds[0] / Math.SQRT2;
  ch.options.scales.y.max = r.ds[r.ds.length - 1] * Math.SQRT2;
  ch.update();
  $('freeze-caption').textContent = T.freeze_caption(r);
  $('freeze-status').textContent = T.computed(r.ms);
  window.sdpa.renders.freeze++;
}
const updateFreeze = latest(freezeRequest, (req) => api('/api/freeze', req), renderFreeze,
  $('freeze-status'));
for (const id of ['freeze-scale', 'freeze-dmax', 'freeze-nmax']) {
  $(id).addEventListener('input', updateFreeze);
}

// ---- start ------------------------------------------------------------------------------------
showScoreControls();
$('temp-value').textContent = f(tempValue());
updateScores();
updateSoftmax();
updateFreeze();
