package dispatch

// ring is a FIFO queue on a growable ring buffer whose size is a power of
// two. The zero value is empty.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func (q *ring[T]) len() int { return q.n }

func (q *ring[T]) push(v T) {
	if q.n == len(q.buf) {
		size := 2 * len(q.buf)
		if size == 0 {
			size = 16
		}
		buf := make([]T, size)
		for i := 0; i < q.n; i++ {
			buf[i] = q.buf[(q.head+i)&(len(q.buf)-1)]
		}
		q.buf, q.head = buf, 0
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = v
	q.n++
}

// at returns the i-th oldest element; i must be below len.
func (q *ring[T]) at(i int) T { return q.buf[(q.head+i)&(len(q.buf)-1)] }

// front returns the oldest element; the queue must not be empty.
func (q *ring[T]) front() T { return q.buf[q.head] }

// pop removes and returns the oldest element; the queue must not be empty.
func (q *ring[T]) pop() T {
	var zero T
	v := q.buf[q.head]
	q.buf[q.head] = zero // let the GC have it
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	return v
}

// filter keeps, in order, the elements for which keep returns true, and
// returns how many it removed.
func (q *ring[T]) filter(keep func(T) bool) int {
	var zero T
	kept := 0
	for i := range q.n {
		if v := q.at(i); keep(v) {
			q.buf[(q.head+kept)&(len(q.buf)-1)] = v
			kept++
		}
	}
	for i := kept; i < q.n; i++ {
		q.buf[(q.head+i)&(len(q.buf)-1)] = zero // let the GC have it
	}
	removed := q.n - kept
	q.n = kept
	return removed
}
