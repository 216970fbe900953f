// torchdoctor report --baseline: draws the baseline run's curves, dashed, on the step charts
// report.js has drawn (loss and gradient norm, step time, memory). Each chart it adds to gets
// data-baseline="N" (the points added), and the body data-baseline="drawn" when it is done.
(function () {
  "use strict";
  var digest = JSON.parse(document.getElementById("td-digest").textContent);
  var base = digest.baseline;
  if (!base) return;
  var DASH = { type: "dashed", width: 1.2, opacity: 0.8 };

  function pairs(xs, ys) {
    var out = new Array(xs.length);
    for (var i = 0; i < xs.length; i++) out[i] = [xs[i], ys[i]];
    return out;
  }

  function line(name, series, key, axis, color) {
    return {
      name: name + " (baseline)",
      type: "line",
      yAxisIndex: axis || 0,
      showSymbol: false,
      data: pairs(series.step, series[key]),
      color: color,
      lineStyle: DASH,
      z: 10, // over the stacked areas of the step-time chart
    };
  }

  function overlay(id, added) {
    var el = document.getElementById(id);
    if (!el || !added.length) return;
    var chart = echarts.getInstanceByDom(el);
    if (!chart) return;
    // Appended after the chart's own series: empty objects leave those as they are.
    var keep = chart.getOption().series.map(function () {
      return {};
    });
    chart.setOption({ series: keep.concat(added) });
    var points = added.reduce(function (n, s) {
      return n + s.data.length;
    }, 0);
    el.setAttribute("data-baseline", String(points));
  }

  var steps = [
    ["chart-training", base.training, [["loss", "loss", 0, "#93c5fd"], ["grad norm", "grad_norm", 1, "#fdba74"]]],
    ["chart-phases", base.phases, [["step time", "duration", 0, "#111827"]]],
    ["chart-memory", base.memory, [["allocated", "allocated", 0, "#6b7280"]]],
  ];
  steps.forEach(function (item) {
    var series = item[1];
    if (!series || !series.step || !series.step.length) return;
    try {
      overlay(
        item[0],
        item[2].map(function (s) {
          return line(s[0], series, s[1], s[2], s[3]);
        })
      );
    } catch (e) {
      var box = document.getElementById("td-errors");
      if (box) {
        box.textContent += "The baseline could not be drawn: " + e + "\n";
        box.hidden = false;
      }
    }
  });
  document.body.setAttribute("data-baseline", "drawn");
})();
