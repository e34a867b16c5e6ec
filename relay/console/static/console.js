// The console's live pages: every two seconds, fetch the fragment #live came from
// (server-rendered, so escaped by its templates) and put it in place, then draw the
// rates it carries (a JSON data block) into the page's uPlot charts.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var charts = {};
  var COLORS = ["#2a6fdb", "#d9822b", "#c23030", "#0f9960"];

  function series(data, names) {
    var times = data.t || [];
    return [times].concat(names.map(function (n) { return data[n] || []; }));
  }

  function draw() {
    var block = document.querySelector("#live script.rates");
    if (!block || typeof uPlot === "undefined") { return; }
    var data = JSON.parse(block.textContent);
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var names = el.dataset.series.split(",");
      var labels = el.dataset.labels.split(",");
      var rows = series(data, names);
      if (charts[el.dataset.chart]) {
        charts[el.dataset.chart].setData(rows);
        return;
      }
      charts[el.dataset.chart] = new uPlot({
        width: Math.max(el.clientWidth, 280), height: 140,
        series: [{}].concat(names.map(function (n, i) {
          return {label: labels[i], stroke: COLORS[i % 4], width: 1.5};
        })),
        axes: [{}, {size: 60}], legend: {live: false}
      }, rows, el);
    });
  }

  function refresh() {
    fetch(live.dataset.src, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) {
        if (r.redirected || !r.ok) { throw new Error(r.status); }
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        live.classList.remove("stale");
        draw();
      })
      .catch(function () { live.classList.add("stale"); });
  }

  if (live) {
    draw();
    setInterval(refresh, 2000);
  }
})();
