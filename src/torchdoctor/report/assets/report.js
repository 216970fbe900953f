// torchdoctor report: turns the digest embedded in the page into ECharts options. All drawing is
// ECharts'; this file only maps data to options, marks the diagnoses at their steps, and leaves
// a trace in the DOM (data-drawn, data-points) that tests and curious readers can check.
(function () {
  "use strict";
  var digest = JSON.parse(document.getElementById("td-digest").textContent);
  var COLORS = { error: "#c0392b", warning: "#d68910", info: "#2e86c1" };
  // The bands of the step time, in digest/time_split.py's order; evaluation and compile are
  // drawn only for runs that have some.
  var PHASE_LABELS = {
    data_wait: "data",
    forward: "forward",
    evaluation: "evaluation",
    compile: "compile",
    backward: "backward",
    optimizer: "optimizer",
    other: "other",
  };
  var OPTIONAL_PHASES = ["evaluation", "compile"];
  var PHASE_COLORS = {
    data_wait: "#e67e22",
    forward: "#3498db",
    evaluation: "#16a085",
    compile: "#c0392b",
    backward: "#8e44ad",
    optimizer: "#27ae60",
    other: "#95a5a6",
  };
  var GROUP = "steps";
  var LOSS_COLOR = "#2563eb";
  var GRAD_COLOR = "#ea580c";

  function seconds(v) {
    if (v === null || v === undefined) return "-";
    var a = Math.abs(v);
    if (a < 1e-3) return (v * 1e6).toFixed(0) + " us";
    if (a < 1) return (v * 1e3).toFixed(a < 0.01 ? 2 : 1) + " ms";
    return v.toFixed(2) + " s";
  }

  function bytes(v) {
    if (v === null || v === undefined) return "-";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return (i ? +v.toPrecision(3) : v.toFixed(0)) + " " + units[i];
  }

  function number(v) {
    if (v === null || v === undefined) return "-";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3).replace(/\.?0+e/, "e");
    return String(+v.toPrecision(5));
  }

  function pairs(xs, ys) {
    var out = new Array(xs.length);
    for (var i = 0; i < xs.length; i++) out[i] = [xs[i], ys[i]];
    return out;
  }

  // Vertical lines at the diagnosed steps, coloured by the most severe diagnosis there and
  // labelled with the kinds found at that step (see spreadLabels for nearby steps).
  var RANK = { error: 0, warning: 1, info: 2 };
  function unique(xs) {
    return xs.filter(function (x, i) {
      return xs.indexOf(x) === i;
    });
  }
  function marks(toX) {
    var byX = {};
    var order = [];
    digest.diagnoses.forEach(function (d) {
      if (d.step === null) return;
      var x = toX ? toX(d.step) : d.step;
      if (x === null) return;
      if (!(x in byX)) {
        byX[x] = [];
        order.push(x);
      }
      byX[x].push(d);
    });
    var data = order.map(function (x) {
      var found = byX[x].slice().sort(function (a, b) {
        return (RANK[a.severity] || 3) - (RANK[b.severity] || 3);
      });
      var color = COLORS[found[0].severity] || "#555";
      var kinds = unique(
        found.map(function (d) {
          return d.kind;
        })
      );
      return {
        xAxis: x,
        name: kinds.join(", ") + " (step " + found[0].step + ")",
        diagnosis: found[0].id,
        lineStyle: { color: color, type: "dashed", width: 1.5 },
        label: { formatter: kinds.join(", "), color: color, position: "insideEndTop" },
      };
    });
    return { symbol: "none", silent: false, animation: false, data: data };
  }

  function valueAxis(extra) {
    var axis = { axisLabel: { formatter: number } };
    for (var k in extra) axis[k] = extra[k];
    return axis;
  }

  function stepAxis() {
    return { type: "value", name: "step", nameLocation: "end", scale: true, minInterval: 1 };
  }

  function zoom() {
    return [{ type: "inside", xAxisIndex: 0, filterMode: "none" }];
  }

  function note(id, series) {
    var el = document.getElementById(id + "-note");
    if (!el || !series || series.total === undefined) return;
    el.textContent =
      series.kept < series.total
        ? series.kept.toLocaleString() + " of " + series.total.toLocaleString() +
          " steps drawn: the lowest and highest of each stretch of steps, and every diagnosed step."
        : series.total.toLocaleString() + " steps.";
  }

  // A mark's label is written along its line. Marks closer together than LABEL_GAP pixels
  // (diagnoses at nearby steps, or a long run squeezed into the width) would print their labels
  // over each other: a stretch of such marks shares one label, on its first line, naming the
  // kinds of all of them; every line stays drawn. Placed again when a zoom or a resize moves
  // the lines.
  var LABEL_GAP = 18;
  function spreadLabels(chart, seriesIndex, toX) {
    var base = marks(toX).data;
    if (!base.length) return;
    function place() {
      var placed = base.map(function (d) {
        var px = chart.convertToPixel({ xAxisIndex: 0 }, d.xAxis);
        return { d: d, px: typeof px === "number" && isFinite(px) ? px : null };
      });
      var shown = placed
        .filter(function (p) {
          return p.px !== null;
        })
        .sort(function (a, b) {
          return a.px - b.px;
        });
      var groups = [];
      shown.forEach(function (p) {
        var group = groups[groups.length - 1];
        if (group && p.px - group[0].px < LABEL_GAP) group.push(p);
        else groups.push([p]);
      });
      var label = {};
      groups.forEach(function (group) {
        var kinds = [];
        group.forEach(function (p) {
          kinds = kinds.concat(p.d.label.formatter.split(", "));
        });
        label[group[0].d.xAxis] = unique(kinds).join(", ");
      });
      var data = base.map(function (d) {
        var text = label[d.xAxis];
        var l = { formatter: text || "", color: d.label.color, position: d.label.position };
        if (!text) l.show = false;
        return {
          xAxis: d.xAxis,
          name: d.name,
          diagnosis: d.diagnosis,
          lineStyle: d.lineStyle,
          label: l,
        };
      });
      var series = [];
      for (var i = 0; i <= seriesIndex; i++) series.push({});
      series[seriesIndex] = { markLine: { data: data } };
      chart.setOption({ series: series });
    }
    place();
    chart.on("datazoom", place);
    window.addEventListener("resize", place);
  }

  function draw(id, option, points, linked) {
    var el = document.getElementById(id);
    if (!el) return null;
    var chart = echarts.init(el, null, { renderer: "svg" });
    option.animation = false;
    chart.setOption(option);
    if (linked !== false) chart.group = GROUP; // zoom and tooltips move together
    chart.on("click", function (p) {
      var id = p.data && p.data.diagnosis;
      if (id !== undefined) {
        var target = document.getElementById("diagnosis-" + id);
        if (target) target.scrollIntoView({ behavior: "smooth" });
      }
    });
    el.setAttribute("data-points", String(points));
    el.setAttribute("data-drawn", el.querySelectorAll("svg path").length > 0 ? "true" : "empty");
    window.addEventListener("resize", function () {
      chart.resize();
    });
    return chart;
  }

  function training() {
    var s = digest.training;
    if (!s || !s.step.length) return;
    var yAxis = [
      valueAxis({ type: s.scale.loss === "log" ? "log" : "value", name: "loss", scale: true }),
      valueAxis({
        type: s.scale.grad_norm === "log" ? "log" : "value",
        name: "grad norm",
        scale: true,
        splitLine: { show: false },
      }),
      { type: "value", min: 0, max: 1, show: false },
    ];
    var series = [
      {
        name: "loss",
        type: "line",
        yAxisIndex: 0,
        showSymbol: false,
        data: pairs(s.step, s.loss),
        color: LOSS_COLOR,
        lineStyle: { width: 1.5 },
        markLine: marks(),
      },
      {
        name: "grad norm",
        type: "line",
        yAxisIndex: 1,
        showSymbol: false,
        data: pairs(s.step, s.grad_norm),
        color: GRAD_COLOR,
        lineStyle: { width: 1.2 },
      },
    ];
    ["loss", "grad_norm"].forEach(function (key) {
      var bad = s.nonfinite[key];
      if (!bad || !bad.length) return;
      series.push({
        name: (key === "loss" ? "loss" : "grad norm") + " not finite",
        type: "scatter",
        yAxisIndex: 2,
        symbol: "triangle",
        symbolSize: 7,
        itemStyle: { color: COLORS.error },
        data: bad.map(function (x) {
          return [x, key === "loss" ? 0.97 : 0.92];
        }),
      });
    });
    var chart = draw(
      "chart-training",
      {
        tooltip: { trigger: "axis", valueFormatter: number },
        legend: { top: 0 },
        grid: { left: 70, right: 80, top: 40, bottom: 40 },
        xAxis: stepAxis(),
        yAxis: yAxis,
        dataZoom: zoom(),
        series: series,
      },
      s.step.length
    );
    if (chart) spreadLabels(chart, 0);
    note("chart-training", s);
  }

  function phases() {
    var s = digest.phases;
    if (!s || !s.step.length) return;
    var keys = Object.keys(PHASE_LABELS).filter(function (key) {
      if (!s[key]) return false;
      return (
        OPTIONAL_PHASES.indexOf(key) < 0 ||
        s[key].some(function (v) {
          return v;
        })
      );
    });
    var series = keys.map(function (key, i) {
      return {
        name: PHASE_LABELS[key],
        type: "line",
        stack: "phases",
        areaStyle: { opacity: 0.85 },
        lineStyle: { width: 0 },
        showSymbol: false,
        color: PHASE_COLORS[key],
        data: pairs(s.step, s[key]),
        markLine: i === keys.length - 1 ? marks() : undefined,
      };
    });
    var chart = draw(
      "chart-phases",
      {
        tooltip: { trigger: "axis", valueFormatter: seconds },
        legend: { top: 0 },
        grid: { left: 70, right: 30, top: 40, bottom: 40 },
        xAxis: stepAxis(),
        yAxis: { type: "value", name: "seconds", axisLabel: { formatter: seconds } },
        dataZoom: zoom(),
        series: series,
      },
      s.step.length
    );
    if (chart) spreadLabels(chart, keys.length - 1);
    note("chart-phases", s);
  }

  function memory() {
    var s = digest.memory;
    if (!s || !s.step.length) return;
    var names = { allocated: "allocated", reserved: "reserved", max_allocated: "peak" };
    var series = Object.keys(names).map(function (key, i) {
      return {
        name: names[key],
        type: "line",
        showSymbol: false,
        data: pairs(s.step, s[key]),
        lineStyle: { width: 1.2, type: key === "max_allocated" ? "dotted" : "solid" },
        markLine: i === 0 ? marks() : undefined,
      };
    });
    var chart = draw(
      "chart-memory",
      {
        tooltip: { trigger: "axis", valueFormatter: bytes },
        legend: { top: 0 },
        grid: { left: 80, right: 30, top: 40, bottom: 40 },
        xAxis: stepAxis(),
        yAxis: { type: "value", scale: true, axisLabel: { formatter: bytes } },
        dataZoom: zoom(),
        series: series,
      },
      s.step.length
    );
    if (chart) spreadLabels(chart, 0);
    note("chart-memory", s);
  }

  function modules() {
    var m = digest.modules;
    if (!m || !m.items.length) return;
    var items = m.items.slice().reverse();
    var labels = items.map(function (it) {
      return it.module + " (" + it.type + ")";
    });
    draw(
      "chart-modules",
      {
        tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: seconds },
        legend: { top: 0 },
        grid: { left: 10, right: 40, top: 40, bottom: 30, containLabel: true },
        xAxis: {
          type: "value",
          name: "per traced step",
          nameLocation: "middle",
          nameGap: 24,
          axisLabel: { formatter: seconds },
        },
        yAxis: { type: "category", data: labels },
        series: [
          {
            name: "forward",
            type: "bar",
            stack: "t",
            color: PHASE_COLORS.forward,
            data: items.map(function (it) {
              return it.forward;
            }),
          },
          {
            name: "backward",
            type: "bar",
            stack: "t",
            color: PHASE_COLORS.backward,
            data: items.map(function (it) {
              return it.backward;
            }),
          },
        ],
      },
      items.length,
      false
    );
  }

  function heatmap() {
    var h = digest.grad_heatmap;
    if (!h || !h.cells.length) return;
    var values = h.cells
      .map(function (c) {
        return c[2];
      })
      .filter(function (v) {
        return v !== null;
      });
    var lo = values.length ? Math.min.apply(null, values) : 0;
    var hi = values.length ? Math.max.apply(null, values) : 1;
    if (hi - lo < 1e-9) {
      lo -= 0.5;
      hi += 0.5;
    }
    var labels = h.steps.map(function (s) {
      return h.width > 1 ? s + "-" + (s + h.width - 1) : String(s);
    });
    var toColumn = function (step) {
      var best = null;
      for (var i = 0; i < h.steps.length; i++) if (h.steps[i] <= step) best = i;
      return best === null ? null : labels[best];
    };
    var missing = h.cells
      .filter(function (c) {
        return c[2] === null;
      })
      .map(function (c) {
        return [c[0], c[1], c[3]];
      });
    var series = [
      {
        name: "log10 grad norm",
        type: "heatmap",
        data: h.cells
          .filter(function (c) {
            return c[2] !== null;
          })
          .map(function (c) {
            return [c[0], c[1], c[2], c[3]];
          }),
        markLine: marks(toColumn),
      },
    ];
    if (missing.length) {
      series.push({
        name: "no finite gradient",
        type: "scatter",
        symbol: "rect",
        symbolSize: 6,
        itemStyle: { color: "#222" },
        data: missing,
      });
    }
    var chart = draw(
      "chart-heatmap",
      {
        tooltip: {
          formatter: function (p) {
            var v = p.data;
            return (
              h.modules[v[1]] + "<br>steps " + labels[v[0]] + "<br>grad norm " +
              (p.seriesType === "heatmap" ? number(v[3]) : v[2])
            );
          },
        },
        grid: { left: 10, right: 90, top: 20, bottom: 60, containLabel: true },
        xAxis: { type: "category", data: labels, name: "step", splitArea: { show: false } },
        yAxis: { type: "category", data: h.modules, inverse: true },
        visualMap: {
          type: "continuous",
          dimension: 2,
          min: lo,
          max: hi,
          seriesIndex: 0,
          calculable: true,
          orient: "vertical",
          right: 0,
          top: "middle",
          text: [number(Math.pow(10, hi)), number(Math.pow(10, lo))],
          inRange: { color: ["#313695", "#4575b4", "#abd9e9", "#fee090", "#f46d43", "#a50026"] },
        },
        series: series,
      },
      h.cells.length,
      false
    );
    if (chart) spreadLabels(chart, 0, toColumn);
  }

  function ranks() {
    var r = digest.rank_times;
    if (!r || r.ranks.length < 2) return;
    var series = r.series.map(function (s, i) {
      return {
        name: "rank " + r.ranks[i],
        type: "line",
        showSymbol: false,
        lineStyle: { width: 1 },
        data: pairs(s.step, s.duration),
        markLine: i === 0 ? marks() : undefined,
      };
    });
    var chart = draw(
      "chart-ranks",
      {
        tooltip: { trigger: "axis", valueFormatter: seconds },
        legend: { top: 0, type: "scroll" },
        grid: { left: 70, right: 30, top: 40, bottom: 40 },
        xAxis: stepAxis(),
        yAxis: { type: "value", name: "step time", axisLabel: { formatter: seconds } },
        dataZoom: zoom(),
        series: series,
      },
      r.series.reduce(function (n, s) {
        return n + s.step.length;
      }, 0)
    );
    if (chart) spreadLabels(chart, 0);
  }

  [training, phases, memory, modules, heatmap, ranks].forEach(function (f) {
    try {
      f();
    } catch (e) {
      var box = document.getElementById("td-errors");
      if (box) {
        box.textContent += "A chart could not be drawn: " + e + "\n";
        box.hidden = false;
      }
    }
  });
  echarts.connect(GROUP);
  document.body.setAttribute("data-report", "ready");
})();
