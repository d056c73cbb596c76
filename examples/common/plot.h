// Plots for the QAT examples (qgrad-qat-mlp, qgrad-qat-cnn): line charts (loss / accuracy per epoch) and a
// histogram with vertical grid lines (weights against their int8 grid).
// PNG through gnuplot when it is on PATH (a .gp script and .dat data are
// written next to the image and gnuplot runs through posix_spawnp, no
// shell), hand-written SVG otherwise.
#pragma once

#include <string>
#include <vector>

namespace qgrad_examples {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

struct LineChart {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
};

struct Histogram {
  std::string title, xlabel;
  std::vector<double> values;      // the samples
  int bins = 60;
  std::vector<double> grid;        // x positions of vertical grid lines
  std::string grid_label;
};

enum class PlotFormat { automatic, png, svg };

// True when `program` is an executable file in a PATH directory.
bool on_path(const std::string& program);

// Writes `<stem>.png` (gnuplot) or `<stem>.svg`; returns the path written.
// Throws std::runtime_error when a file cannot be written or gnuplot fails.
std::string plot_lines(const LineChart& chart, const std::string& stem, PlotFormat format);
std::string plot_histogram(const Histogram& hist, const std::string& stem, PlotFormat format);

}  // namespace qgrad_examples
