package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"runtime"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Colours of the consumers (A, B, C, D, E).
var barColors = map[byte]color.RGBA{
	'A': {0x8c, 0x8c, 0x8c, 0xff},
	'B': {0x4c, 0x72, 0xb0, 0xff},
	'C': {0xdd, 0x84, 0x52, 0xff},
	'D': {0x55, 0xa8, 0x68, 0xff},
	'E': {0xc4, 0x4e, 0x52, 0xff},
	'P': {0x81, 0x72, 0xb3, 0xff},
}

// drawChart draws one horizontal bar per throughput row, a panel per record
// size with its own scale, and writes it as PNG. The image is drawn at half
// size with the 7x13 bitmap font and scaled up twice, so the text stays crisp.
func drawChart(path string, r *report) error {
	const (
		w, labelW, rowH, barH, panelGap, top = 640, 200, 16, 12, 26, 34
		valueW                               = 170
	)
	sizes := r.Plan.Sizes
	h := top + 10
	for _, s := range sizes {
		h += panelGap + rowH*len(rowsOf(r, s))
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	title := "fanout throughput vs Kafka tools and plain sarama (msg/s)"
	if r.Plan.Quick {
		title += " - QUICK RUN"
	}
	text(img, 8, 14, title, color.Black)
	text(img, 8, 28, fmt.Sprintf("8 partitions, Kafka 4.4 on loopback, %d CPUs; load average %s", runtime.NumCPU(), r.LoadBefore), color.Gray{0x60})
	y := top
	for _, s := range sizes {
		rows := rowsOf(r, s)
		y += panelGap
		text(img, 8, y-6, fmt.Sprintf("%s messages", sizeLabel(s)), color.Black)
		maxRate := 1.0
		for _, t := range rows {
			maxRate = max(maxRate, t.MsgPerS)
		}
		barMax := float64(w - labelW - valueW - 10)
		for i, t := range rows {
			ry := y + i*rowH
			text(img, 8, ry+barH-2, chartLabel(t), color.Black)
			bw := int(t.MsgPerS / maxRate * barMax)
			fill(img, image.Rect(labelW, ry, labelW+max(bw, 1), ry+barH), barColors[t.Consumer[0]])
			text(img, labelW+bw+4, ry+barH-2, fmt.Sprintf("%s  %.1f MB/s", thousands(t.MsgPerS), t.MBPerS), color.Gray{0x30})
		}
		y += rowH * len(rows)
	}
	big := image.NewRGBA(image.Rect(0, 0, 2*w, 2*h))
	for py := range 2 * h {
		for px := range 2 * w {
			big.Set(px, py, img.At(px/2, py/2))
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, big); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func rowsOf(r *report, size int) []Row {
	var out []Row
	for _, t := range r.Throughput {
		if t.Size == size {
			out = append(out, t)
		}
	}
	return out
}

func chartLabel(t Row) string {
	name, _, _ := strings.Cut(t.Consumer, " ")
	switch name {
	case "A":
		return "A ConsumerPerformance"
	case "B":
		return "B plain sarama"
	case "C":
		return fmt.Sprintf("C fanout, %d client(s)", t.K)
	case "E":
		return fmt.Sprintf("E spread, %d member(s), %s", t.Members, storeLabel(t.Store))
	case "P":
		return fmt.Sprintf("P %s, %d client(s)", strings.TrimPrefix(t.Consumer, "P python "), t.K)
	default:
		return fmt.Sprintf("D share group, %d thr", t.K)
	}
}

func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
